"""The policy-compiler across restarts and bus losses, against a real
nats-server: a broken file never deletes what its last good version
published (also when the compiler restarts while it is broken; the last good
version is read back from the config bucket), only a removed file removes
objects, and a NATS restarted with empty storage is given everything again."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import nats
import pytest
import structlog

from kinference_common import subjects
from kinference_common.compiled import decode_pool
from kinference_common.natsserver import NatsServer
from kinference_policy_compiler.service import PolicyCompilerService, Settings

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "deploy" / "examples"
KEY = "default.inference-all"
BROKEN = "apiVersion: kinference.buoyant.io/v1alpha1\nkind: InferencePool\nmetadata: {name: inference-all\n"


@pytest.fixture
def manifests(tmp_path: Path) -> Path:
    d = tmp_path / "manifests"
    shutil.copytree(EXAMPLES, d)
    return d


def compiler(url: str, manifests: Path, **kw: object) -> PolicyCompilerService:
    return PolicyCompilerService(Settings(manifests=manifests, nats_url=url, interval=0.05, **kw))  # type: ignore[arg-type]


async def pool_revision(nc: nats.NATS) -> str | None:
    try:
        kv = await nc.jetstream().key_value(subjects.CONFIG_BUCKET)
        entry = await kv.get(KEY)
    except (nats.js.errors.BucketNotFoundError, nats.js.errors.KeyNotFoundError):
        return None
    return decode_pool(entry.value).revision if entry.value else None


async def eventually(check, timeout: float = 15.0):  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            if result := await check():
                return result
        except Exception:
            if asyncio.get_running_loop().time() > deadline:
                raise
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.05)


async def test_restart_while_broken_keeps_the_pool_and_removing_the_file_deletes_it(
        nats_server: NatsServer, manifests: Path) -> None:
    first = compiler(nats_server.url, manifests)
    await first.start()
    await first.stop()
    nc = await nats.connect(nats_server.url)
    try:
        revision = await pool_revision(nc)
        assert revision is not None
        pool_file = manifests / "20-pool.yaml"
        pool_file.write_text(BROKEN)  # broken while no compiler runs

        second = compiler(nats_server.url, manifests)
        await second.start()
        try:
            assert second.last_result is not None
            assert ("default", "inference-all") in second.last_result.pools  # its last good version
            assert any("20-pool.yaml" in str(e.document) for e in second.source.errors())
            await asyncio.sleep(0.3)  # a few passes of the loop
            assert await pool_revision(nc) == revision  # never deleted, never changed

            # restarted again, still broken: the record survived the second run too
            await second.stop()
            third = compiler(nats_server.url, manifests)
            await third.start()
            assert await pool_revision(nc) == revision

            pool_file.unlink()  # only a removed file removes objects
            await eventually(lambda: _none(pool_revision(nc)))
            kv = await nc.jetstream().key_value(subjects.CONFIG_BUCKET)
            keys = await kv.keys()
            assert not any(k.startswith(subjects.CONFIG_SOURCE_PREFIX) and "20-pool" in k for k in keys)
            await third.stop()
        finally:
            await second.stop()
    finally:
        await nc.close()


async def _none(coro) -> bool:  # type: ignore[no-untyped-def]
    return await coro is None


async def test_a_stored_record_is_not_trusted_when_it_does_not_compile(nats_server: NatsServer,
                                                                      manifests: Path) -> None:
    """A record someone wrote by hand that is itself broken is ignored (the
    file then contributes nothing, as a file broken from its first version)."""
    first = compiler(nats_server.url, manifests)
    await first.start()
    await first.stop()
    nc = await nats.connect(nats_server.url)
    try:
        from kinference_policy_compiler.publisher import SourceRecord, source_digest
        import msgspec

        kv = await nc.jetstream().key_value(subjects.CONFIG_BUCKET)
        await kv.put(subjects.config_source_key(source_digest("20-pool.yaml")),
                     msgspec.json.encode(SourceRecord("20-pool.yaml", BROKEN)))
        (manifests / "20-pool.yaml").write_text(BROKEN)
        svc = compiler(nats_server.url, manifests)
        await svc.start()
        try:
            assert svc.last_result is not None
            assert ("default", "inference-all") not in svc.last_result.pools
        finally:
            await svc.stop()
    finally:
        await nc.close()


async def test_nats_restarted_with_empty_storage_gets_everything_back(nats_server: NatsServer,
                                                                      manifests: Path) -> None:
    svc = compiler(nats_server.url, manifests)
    with structlog.testing.capture_logs() as logs:
        await svc.start()
        nc: nats.NATS | None = None
        try:
            # a file broken before the bus loses everything: its last good version is republished too
            revision = None
            nc = await nats.connect(nats_server.url, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
            revision = await pool_revision(nc)
            (manifests / "20-pool.yaml").write_text(BROKEN)
            await eventually(lambda: _has_errors(svc))
            nats_server.kill()
            nats_server.restart(wipe=True)
            await eventually(lambda: _equals(pool_revision(nc), revision))
            kv = await nc.jetstream().key_value(subjects.CONFIG_BUCKET)
            keys = await kv.keys()
            assert any(k.startswith(subjects.CONFIG_SOURCE_PREFIX + ".") for k in keys)  # records too

            # and again: healing is not a one-off
            nats_server.kill()
            nats_server.restart(wipe=True)
            await eventually(lambda: _equals(pool_revision(nc), revision))
        finally:
            await svc.stop()
            if nc is not None:
                await nc.close()
    recreated = [e for e in logs if "recreated" in e["event"]]
    assert len(recreated) == 2, [e["event"] for e in logs]  # once per loss, not once per pass
    failures = [e for e in logs if e["event"] == "publish failed, will retry"]
    assert len(failures) <= 2


async def _has_errors(svc: PolicyCompilerService) -> bool:
    return bool(svc.source.errors())


async def _equals(coro, value) -> bool:  # type: ignore[no-untyped-def]
    return await coro == value


async def test_a_deleted_key_is_written_again_at_the_periodic_resync(nats_server: NatsServer,
                                                                     manifests: Path) -> None:
    """Level-triggered: the compiler compares with what the bucket holds, not
    with what it remembers sending."""
    svc = compiler(nats_server.url, manifests, resync=0.3)
    await svc.start()
    nc = await nats.connect(nats_server.url)
    try:
        revision = await pool_revision(nc)
        kv = await nc.jetstream().key_value(subjects.CONFIG_BUCKET)
        await kv.delete(KEY)
        assert await pool_revision(nc) is None
        await eventually(lambda: _equals(pool_revision(nc), revision))
    finally:
        await svc.stop()
        await nc.close()


ALL_TO_PROVIDER = """apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePolicy
metadata: {name: burst-unless-pii, namespace: default}
spec:
  rules:
    - name: all-to-provider
      route: {select: [{type: Provider, order: [databricks]}]}
"""


async def rules_published(nc: nats.NATS) -> list[str]:
    kv = await nc.jetstream().key_value(subjects.CONFIG_BUCKET)
    return [r.name for r in decode_pool((await kv.get(KEY)).value).policy.rules]  # type: ignore[union-attr]


async def test_a_new_file_reusing_a_policy_name_is_refused_not_put_in_force(
        nats_server: NatsServer, manifests: Path) -> None:
    """User trial: a new file 05-other.yaml (sorting before the policy's own
    file) defining a policy of the same name replaced the policy in force, and
    a PII prompt went to the provider. The definition in force stays, the
    newcomer is the one refused (its file named), also after a restart; once
    the first file is removed, the other definition is the only one and
    applies."""
    svc = compiler(nats_server.url, manifests)
    await svc.start()
    nc = await nats.connect(nats_server.url)
    try:
        before = await rules_published(nc)
        assert before == ["local-first-then-provider-unless-pii"]
        (manifests / "05-other.yaml").write_text(ALL_TO_PROVIDER)
        await eventually(lambda: _has_error(svc, "05-other.yaml"))
        [err] = [e for e in svc.last_errors if "defined twice" in e.message]
        assert err.document.source.endswith("05-other.yaml")
        assert "10-burst-policy.yaml#1 is used and this one is ignored" in err.message
        await asyncio.sleep(0.3)
        assert await rules_published(nc) == before

        await svc.stop()
        svc = compiler(nats_server.url, manifests)  # the order in force outlives a restart
        await svc.start()
        await asyncio.sleep(0.3)
        assert await rules_published(nc) == before
        assert any(e.document.source.endswith("05-other.yaml") for e in svc.last_errors)

        (manifests / "10-burst-policy.yaml").unlink()
        await eventually(lambda: _rules_are(nc, ["all-to-provider"]))
    finally:
        await svc.stop()
        await nc.close()


async def _has_error(svc: PolicyCompilerService, source: str) -> bool:
    return any(e.document.source.endswith(source) for e in svc.last_errors)


async def _rules_are(nc: nats.NATS, rules: list[str]) -> bool:
    return await rules_published(nc) == rules


def test_a_file_removed_and_written_again_comes_back_as_a_newcomer(manifests: Path) -> None:
    """The order in force forgets a removed file: written again later, it is
    refused against a definition that came in force meanwhile."""
    from kinference_common.compiler import compile_documents
    from kinference_policy_compiler.source import DirectorySource

    d = manifests
    src = DirectorySource(d)
    src.poll()
    policy = d / "10-burst-policy.yaml"
    original = policy.read_text()
    policy.unlink()
    (d / "50-other.yaml").write_text(ALL_TO_PROVIDER)
    src.poll()
    policy.write_text(original)  # back, sorting first: still the newcomer
    src.poll()
    res = compile_documents(src.documents())
    [err] = [e for e in res.errors if "defined twice" in e.message]
    assert err.document.source.endswith("10-burst-policy.yaml") and "50-other.yaml#1 is used" in err.message
    assert [r.name for r in res.pools[("default", "inference-all")].policy.rules] == ["all-to-provider"]


@pytest.mark.nats
async def test_an_edit_reaches_routers_while_the_cluster_has_no_quorum(nats_cluster, manifests: Path) -> None:  # type: ignore[no-untyped-def]
    """HA trial: with two servers of three down, an edit compiled ("reconciled")
    but reached no router until quorum was back: the KV write, which needs the
    quorum, came first and failed, and the subject (which routers follow,
    through any server left) was never sent. The subject goes first now; the
    bucket is written once quorum is back."""
    survivor = nats_cluster.urls[0]
    svc = compiler(survivor, manifests, kv_replicas=3)
    await svc.start()
    watcher = await nats.connect(survivor)
    seen: list[list[str]] = []

    async def on(msg):  # type: ignore[no-untyped-def]
        if msg.data:
            seen.append([r.name for r in decode_pool(msg.data).policy.rules])

    try:
        await watcher.subscribe(subjects.config_subject("default", "inference-all"), cb=on)
        await watcher.flush()
        nats_cluster.kill(1)
        nats_cluster.kill(2)
        await asyncio.sleep(1.0)
        policy = manifests / "10-burst-policy.yaml"
        policy.write_text(policy.read_text().replace("local-first-then-provider-unless-pii", "renamed-rule"))
        await eventually(lambda: _seen(seen, ["renamed-rule"]), timeout=10)
        await asyncio.sleep(1.0)  # the pass that failed at the bucket; the next reads it first, and fails there
        policy.write_text(policy.read_text().replace("renamed-rule", "renamed-again"))
        await eventually(lambda: _seen(seen, ["renamed-again"]), timeout=10)  # a second edit in the outage
        nats_cluster.restart(1)
        nats_cluster.restart(2)
        await asyncio.to_thread(nats_cluster.wait_healthy, 60)
        await eventually(lambda: _rules_are(watcher, ["renamed-again"]), timeout=30)
        # and on the subject again once written: a router that read the bucket while it still held
        # the old pool (a reconnect in between) ends on the new one (second review)
        await eventually(lambda: _twice(seen, ["renamed-again"]), timeout=10)
    finally:
        await svc.stop()
        await watcher.close()


async def _seen(seen: list[list[str]], rules: list[str]) -> bool:
    return rules in seen


def _winner(src) -> list[str]:  # type: ignore[no-untyped-def]
    from kinference_common.compiler import compile_documents

    res = compile_documents(src.documents())
    return [r.name for r in res.pools[("default", "inference-all")].policy.rules]


def test_a_newcomer_never_takes_a_number_that_puts_it_before_the_policy_in_force(manifests: Path) -> None:
    """Review: files removed meanwhile handed their places to a newcomer
    (the place was the count of files), which then sorted before the file in
    force and replaced its policy (a PII prompt went to the provider)."""
    from kinference_policy_compiler.source import DirectorySource

    d = manifests
    src = DirectorySource(d)
    (d / "30-h1.yaml").write_text("# nothing\n")
    (d / "31-h2.yaml").write_text("# nothing\n")
    src.poll()
    policy = d / "10-burst-policy.yaml"
    policy.rename(d / "40-burst-policy.yaml")
    src.poll()
    (d / "30-h1.yaml").unlink()
    (d / "31-h2.yaml").unlink()
    src.poll()
    (d / "99-other.yaml").write_text(ALL_TO_PROVIDER)
    src.poll()
    assert _winner(src) == ["local-first-then-provider-unless-pii"]


def test_renaming_the_file_in_force_keeps_its_policy_before_a_refused_duplicate(manifests: Path) -> None:
    from kinference_policy_compiler.source import DirectorySource

    d = manifests
    src = DirectorySource(d)
    src.poll()
    (d / "50-other.yaml").write_text(ALL_TO_PROVIDER)  # refused: the example's policy is in force
    src.poll()
    assert _winner(src) == ["local-first-then-provider-unless-pii"]
    (d / "10-burst-policy.yaml").rename(d / "90-burst-policy.yaml")  # now the newer file
    src.poll()
    assert _winner(src) == ["local-first-then-provider-unless-pii"]
    # an edit of the policy in force keeps it in force too (its file, not its old text, is first)
    p = d / "90-burst-policy.yaml"
    p.write_text(p.read_text().replace("local-first-then-provider-unless-pii", "edited"))
    src.poll()
    assert _winner(src) == ["edited"]


def test_a_copy_of_the_file_in_force_does_not_take_over_when_the_original_is_edited(manifests: Path) -> None:
    """Second review: `cp 10-burst-policy.yaml 50-copy.yaml` (refused), then an
    edit of the original: the copy matched the definition in force by its
    text and took over, and its later edits went into force."""
    from kinference_policy_compiler.source import DirectorySource

    d = manifests
    src = DirectorySource(d)
    src.poll()
    original = d / "10-burst-policy.yaml"
    (d / "50-copy.yaml").write_text(original.read_text())
    src.poll()
    assert _winner(src) == ["local-first-then-provider-unless-pii"]
    original.write_text(original.read_text().replace("local-first-then-provider-unless-pii", "edited"))
    src.poll()
    assert _winner(src) == ["edited"]
    copy = d / "50-copy.yaml"
    copy.write_text(copy.read_text().replace("local-first-then-provider-unless-pii", "copy-edited"))
    src.poll()
    assert _winner(src) == ["edited"]


async def _twice(seen: list[list[str]], rules: list[str]) -> bool:
    return seen.count(rules) >= 2
