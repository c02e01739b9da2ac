"""Change-or-rate publishing (a recording bus, explicit clock) and endpoint files."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from kinference_collector.__main__ import main, parse_args, parser
from kinference_collector.discovery import DiscoveryError, StaticDiscovery, Target, parse_endpoint_file
from kinference_collector.publish import Publisher
from kinference_common.messages import EndpointState, ProviderState


class RecordingBus:
    def __init__(self) -> None:
        self.puts: list[tuple[str, str, dict]] = []  # type: ignore[type-arg]
        #: what the KV bucket holds, by key
        self.stored: dict[str, dict] = {}  # type: ignore[type-arg]
        self.deletes: list[tuple[str, str]] = []
        #: every call fails (NATS away), or only the KV writes (JetStream away)
        self.fail = False
        self.fail_store = False

    async def put(self, subject: str, key: str, data: bytes) -> None:
        if self.fail:
            raise ConnectionError("nats away")
        self.puts.append((subject, key, msgspec.json.decode(data)))

    async def store(self, key: str, data: bytes) -> None:
        if self.fail or self.fail_store:
            raise ConnectionError("nats away")
        self.stored[key] = msgspec.json.decode(data)

    async def delete(self, subject: str, key: str, data: bytes) -> None:
        self.deletes.append((subject, key))


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def ep(queued: int, scraped_at: float = 0.0) -> EndpointState:
    return EndpointState(namespace="ns", worker_set="w.x", pod="p-0", address="a:1", queued=queued,
                         scraped_at=scraped_at, ready=True)


async def test_only_changes_and_minimum_rate() -> None:
    bus, clock = RecordingBus(), Clock()
    pub = Publisher(bus, min_interval=1.0, clock=clock)
    pub.offer_endpoint(ep(1, 0.0))
    assert await pub.flush() == 1
    subject, key, body = bus.puts[0]
    assert subject == "kinference.telemetry.endpoint.ns.w_x.p-0"
    assert key == "endpoint.ns.w_x.p-0"
    assert body["queued"] == 1 and body["workerSet"] == "w.x" and body["schemaVersion"] == 1
    clock.t = 0.1
    pub.offer_endpoint(ep(1, 0.1))  # only scrapedAt moved
    assert await pub.flush() == 0
    clock.t = 0.2
    pub.offer_endpoint(ep(2, 0.2))
    assert await pub.flush() == 1 and bus.puts[-1][2]["queued"] == 2
    clock.t = 1.0
    pub.offer_endpoint(ep(2, 1.0))
    assert await pub.flush() == 0
    clock.t = 1.25  # a second since the last send: republished with the newest scrapedAt
    assert await pub.flush() == 1 and bus.puts[-1][2]["scrapedAt"] == 1.0


async def test_failed_sends_are_retried_with_newest_state() -> None:
    bus, clock = RecordingBus(), Clock()
    pub = Publisher(bus, min_interval=10.0, clock=clock)
    bus.fail = True
    pub.offer_endpoint(ep(1))
    assert await pub.flush() == 0 and pub.failures == 1
    pub.offer_endpoint(ep(5))
    bus.fail = False
    assert await pub.flush() == 1
    assert [b["queued"] for _, _, b in bus.puts] == [5]


async def test_provider_and_removal() -> None:
    bus, clock = RecordingBus(), Clock()
    pub = Publisher(bus, min_interval=10.0, clock=clock)
    pub.offer_provider(ProviderState(namespace="ns", name="openai", estimated_ttft_seconds=0.5, updated_at=1))
    pub.offer_endpoint(ep(1))
    await pub.flush()
    assert {k for _, k, _ in bus.puts} == {"provider.ns.openai", "endpoint.ns.w_x.p-0"}
    pub.remove_endpoint(ep(1))
    await pub.flush()
    assert bus.deletes == [("kinference.telemetry.endpoint.ns.w_x.p-0", "endpoint.ns.w_x.p-0")]
    clock.t = 100
    await pub.flush()  # a removed endpoint is not republished
    assert [k for _, k, _ in bus.puts].count("endpoint.ns.w_x.p-0") == 1


def pod(i: int, queued: int, scraped_at: float) -> EndpointState:
    return EndpointState(namespace="ns", worker_set="w", pod=f"p-{i}", address=f"a:{i}", queued=queued,
                         scraped_at=scraped_at, ready=True)


async def test_many_keys_each_sent_when_changed_or_due_once() -> None:
    """A flush sends the changed keys and those a minimum interval old, each
    once: not the others, not a key another replica took, not a send a later
    one superseded."""
    bus, clock = RecordingBus(), Clock()
    pub = Publisher(bus, min_interval=1.0, clock=clock)
    for i in range(100):
        pub.offer_endpoint(pod(i, 0, 0.0))
    assert await pub.flush() == 100
    clock.t = 0.5
    for i in range(100):
        pub.offer_endpoint(pod(i, 1 if i < 3 else 0, 0.5))
    pub.forget("endpoint.ns.w.p-99")
    bus.puts.clear()
    assert await pub.flush() == 3 and sorted(b["pod"] for _, _, b in bus.puts) == ["p-0", "p-1", "p-2"]
    assert await pub.flush() == 0
    clock.t = 1.0  # p-3..p-98 last sent at 0.0
    bus.puts.clear()
    assert await pub.flush() == 96
    assert sorted(b["pod"] for _, _, b in bus.puts) == sorted(f"p-{i}" for i in range(3, 99))
    clock.t = 1.5  # p-0..p-2 last sent at 0.5, p-3.. at 1.0
    bus.puts.clear()
    assert await pub.flush() == 3 and sorted(b["pod"] for _, _, b in bus.puts) == ["p-0", "p-1", "p-2"]
    clock.t = 1.6
    assert await pub.flush() == 0


async def test_kv_written_once_a_second_every_change_on_the_subject() -> None:
    """A pod whose load moves at every 100 ms scrape: every state on its
    subject, its KV key written at most once a second and at once when its
    readiness changes; the newest state reaches KV within a second."""
    bus, clock = RecordingBus(), Clock()
    pub = Publisher(bus, min_interval=1.0, clock=clock)
    key = "endpoint.ns.w.p-0"
    writes = []
    for k in range(25):
        clock.t = k / 10
        st = pod(0, k, clock.t)
        if k == 13:
            st = msgspec.structs.replace(st, ready=False)
        pub.offer_endpoint(st)
        before = dict(bus.stored)
        assert await pub.flush() == 1
        assert bus.puts[-1][2]["queued"] == k  # every change on the subject
        if bus.stored != before:
            writes.append(k)
        assert clock.t - bus.stored[key]["scrapedAt"] <= 1.0 + 1e-9
    # the first, a second later, the readiness turning false (13) and back (14), then a second after that
    assert writes == [0, 10, 13, 14, 24], writes
    assert pub.stored == 5 and pub.sent_by_kind == {"endpoint": 25, "provider": 0}


async def test_a_send_cancelled_by_a_stop_is_sent_later() -> None:
    """A flush cancelled mid-send (the collector stopping) leaves the state to
    send, for the stop's own flush; a removal is not forgotten either."""
    import asyncio

    class Stuck(RecordingBus):
        def __init__(self) -> None:
            super().__init__()
            self.hang = False

        async def delete(self, subject: str, key: str, data: bytes) -> None:
            if self.hang:
                await asyncio.sleep(3600)
            await super().delete(subject, key, data)

    bus, clock = Stuck(), Clock()
    pub = Publisher(bus, min_interval=1.0, clock=clock)
    pub.offer_endpoint(ep(1))
    assert await pub.flush() == 1
    clock.t = 1.0
    pub.remove_endpoint(ep(1))
    bus.hang = True
    task = asyncio.create_task(pub.flush())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    bus.hang = False
    clock.t = 1.5
    assert await pub.flush() == 1
    assert bus.deletes == [("kinference.telemetry.endpoint.ns.w_x.p-0", "endpoint.ns.w_x.p-0")]


async def test_two_sends_of_one_instant_are_resent_once() -> None:
    bus, clock = RecordingBus(), Clock()
    pub = Publisher(bus, min_interval=1.0, clock=clock)
    pub.offer_endpoint(ep(1))
    assert await pub.flush() == 1
    pub.offer_endpoint(ep(2))
    assert await pub.flush() == 1  # the same instant: two records of the key
    clock.t = 1.0
    bus.puts.clear()
    assert await pub.flush() == 1 and len(bus.puts) == 1


async def test_offers_close_together_go_out_in_one_flush() -> None:
    """States offered within the batch window are sent by one flush."""
    import asyncio

    bus = RecordingBus()
    pub = Publisher(bus, min_interval=10.0, batch=0.1)
    flushes: list[int] = []
    real_flush = pub.flush

    async def counted(**kw: bool) -> int:
        n = await real_flush(**kw)
        flushes.append(n)
        return n

    pub.flush = counted  # type: ignore[method-assign]
    stop = asyncio.Event()
    task = asyncio.create_task(pub.run(stop))
    await asyncio.sleep(0)
    for i in range(5):
        pub.offer_endpoint(pod(i, i, 0.0))
        await asyncio.sleep(0.005)
    for _ in range(100):
        if len(bus.puts) == 5:
            break
        await asyncio.sleep(0.02)
    stop.set()
    await task
    assert len(bus.puts) == 5 and [n for n in flushes if n] == [5]


def test_endpoint_file_forms() -> None:
    yaml_list = """
- {namespace: team, workerSet: llama, pod: llama-0, address: "10.0.0.1:8000", model: m, ready: true}
- {workerSet: llama, pod: llama-1, address: "10.0.0.2:8000"}
"""
    ts = parse_endpoint_file(yaml_list)
    assert ts[0] == Target(namespace="team", worker_set="llama", pod="llama-0", address="10.0.0.1:8000", model="m")
    assert ts[1].namespace == "default" and ts[1].ready
    doc = '{"endpoints": [{"workerSet": "w", "pod": "p", "address": "h:1", "ready": false}], "dcgm": [{"address": "h:9400"}]}'
    ts = parse_endpoint_file(doc)
    assert [t.kind for t in ts] == ["vllm", "dcgm"] and not ts[0].ready
    assert ts[1].base_url == "http://h:9400"
    with pytest.raises(DiscoveryError):
        parse_endpoint_file("- {pod: p}")
    with pytest.raises(DiscoveryError):
        parse_endpoint_file("{{{")


async def test_static_discovery_rereads_and_keeps_last_good(tmp_path: Path) -> None:
    f = tmp_path / "endpoints.yaml"
    f.write_text("- {workerSet: w, pod: p0, address: 'h:1'}\n")
    d = StaticDiscovery(str(f), dcgm=["h:9400"])
    assert [t.pod for t in await d.endpoints()] == ["p0", ""]
    f.write_text("- {workerSet: w, pod: p1, address: 'h:2'}\n- {workerSet: w, pod: p2, address: 'h:3'}\n")
    import os
    os.utime(f, ns=(1, 1))  # a different mtime for certain
    assert [t.pod for t in await d.endpoints()] == ["p1", "p2", ""]
    f.write_text("not: [valid")
    os.utime(f, ns=(2, 2))
    assert [t.pod for t in await d.endpoints()] == ["p1", "p2", ""]


def test_cli_help_and_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--nats-url", "--endpoints-file", "--interval", "--timeout", "--http-port", "--dcgm"):
        assert flag in out
    args = parser().parse_args(["--interval", "0.05", "--timeout", "0.2", "--dcgm", "a:1", "--dcgm", "b:2"])
    assert args.interval == 0.05 and args.timeout == 0.2 and args.dcgm == ["a:1", "b:2"]


def test_the_heartbeat_follows_the_member_ttl_unless_given(capsys: pytest.CaptureFixture[str]) -> None:
    """Every beat is read by every replica: a TTL raised (a slow machine's event
    loop lagging past it) slows the beats with it, a third of it by default."""
    assert parse_args([]).heartbeat == 0.5
    assert parse_args(["--member-ttl", "4"]).heartbeat == pytest.approx(4 / 3)
    assert parse_args(["--member-ttl", "4", "--heartbeat", "0.5"]).heartbeat == 0.5
    assert parse_args(["--member-ttl", "2", "--heartbeat", "1"]).heartbeat == 1
    for beat in ("1.5", "2"):  # one late beat would have the others take it for dead
        with pytest.raises(SystemExit) as exc:
            parse_args(["--member-ttl", "2", "--heartbeat", beat])
        assert exc.value.code == 2
        assert f"--heartbeat {beat} must be at most half of --member-ttl 2" in capsys.readouterr().err


async def test_the_publisher_sleeps_while_nothing_is_due_and_republishes_when_it_is() -> None:
    """With nothing held the publisher's task does not wake (it flushed four
    times a second for nothing, in every replica); a state sent is sent
    again once ``min_interval`` has passed, with no new offer."""
    import asyncio

    bus = RecordingBus()
    pub = Publisher(bus, min_interval=0.2, batch=0.0)
    flushes = 0
    real_flush = pub.flush

    async def counted(**kw: bool) -> int:
        nonlocal flushes
        flushes += 1
        return await real_flush(**kw)

    pub.flush = counted  # type: ignore[method-assign]
    stop = asyncio.Event()
    task = asyncio.create_task(pub.run(stop))
    await asyncio.sleep(0.5)
    assert flushes == 0  # nothing offered: asleep (ticking every 50 ms made 10)
    pub.offer_endpoint(ep(1))
    await asyncio.sleep(0.55)
    assert 2 <= len(bus.puts) <= 4  # at once, then again each time it fell due (0.2 s, on a 50 ms grain)
    t0 = asyncio.get_running_loop().time()
    stop.set()
    await task
    assert asyncio.get_running_loop().time() - t0 < 0.1  # stop wakes it


async def test_a_slow_kv_write_holds_back_no_state_on_the_subject() -> None:
    """The routers follow the subjects; the KV copy is for a starting router.
    The flusher waited for the acknowledgements of its batch's KV writes
    before sending the next states: a changed state waited as long as
    JetStream took to answer. A key's write is one at a time, and one that
    failed is written at its next send."""
    import asyncio

    class SlowKv(RecordingBus):
        def __init__(self) -> None:
            super().__init__()
            self.release = asyncio.Event()
            self.writes = 0

        async def store(self, key: str, data: bytes) -> None:
            self.writes += 1
            await self.release.wait()
            await super().store(key, data)

    bus = SlowKv()
    pub = Publisher(bus, min_interval=0.2, batch=0.0)
    stop = asyncio.Event()
    task = asyncio.create_task(pub.run(stop))
    for q in range(1, 6):  # five changes while the first write waits
        pub.offer_endpoint(ep(q))
        await asyncio.sleep(0.1)
    assert [b["queued"] for _, _, b in bus.puts][:5] == [1, 2, 3, 4, 5]  # each on the subject at once
    assert bus.writes == 1 and bus.stored == {}  # one write of the key at a time, still waiting
    bus.release.set()
    for _ in range(50):
        if bus.stored:
            break
        await asyncio.sleep(0.02)
    key = "endpoint.ns.w_x.p-0"
    for _ in range(50):  # the changes made meanwhile: written once that write ended
        if bus.stored[key]["queued"] == 5:
            break
        await asyncio.sleep(0.02)
    assert bus.stored[key]["queued"] == 5 and bus.writes == 2
    bus.fail_store = True  # JetStream away: the writes fail ...
    pub.offer_endpoint(ep(6))
    await asyncio.sleep(0.3)
    assert bus.puts[-1][2]["queued"] == 6 and pub.failures == 0 and pub.store_failures >= 1  # ... not the sends
    bus.fail_store = False
    for _ in range(50):  # ... and the key is written again at a later send
        if bus.stored[key]["queued"] == 6:
            break
        await asyncio.sleep(0.02)
    assert bus.stored[key]["queued"] == 6
    stop.set()
    await task
    await pub.stored_all()


async def test_a_readiness_change_reaches_kv_when_the_write_before_it_ends() -> None:
    """A readiness change is written to KV at once; when a write of the
    key is still in flight, right after it (not at the next send, a
    min_interval later), and a delete goes after the last write."""
    import asyncio

    gate = asyncio.Event()

    class SlowKv(RecordingBus):
        async def store(self, key: str, data: bytes) -> None:
            await gate.wait()
            await super().store(key, data)

    bus = SlowKv()
    pub = Publisher(bus, min_interval=10.0, batch=0.0)
    stop = asyncio.Event()
    task = asyncio.create_task(pub.run(stop))
    pub.offer_endpoint(ep(1))
    await asyncio.sleep(0.05)
    pub.offer_endpoint(msgspec.structs.replace(ep(1), ready=False))
    await asyncio.sleep(0.05)
    gate.set()
    for _ in range(25):
        if bus.stored.get("endpoint.ns.w_x.p-0", {}).get("ready") is False:
            break
        await asyncio.sleep(0.02)
    assert bus.stored["endpoint.ns.w_x.p-0"]["ready"] is False  # 0.5 s, not the 10 s min_interval
    gate.clear()
    pub.offer_endpoint(ep(2))  # ready again: a write starts and waits ...
    await asyncio.sleep(0.05)
    pub.remove_endpoint(ep(2))  # ... and the pod goes: its delete waits for that write
    await asyncio.sleep(0.05)
    assert bus.deletes == []
    gate.set()
    for _ in range(25):
        if bus.deletes:
            break
        await asyncio.sleep(0.02)
    assert [k for _, k in bus.deletes] == ["endpoint.ns.w_x.p-0"]
    stop.set()
    await task


async def test_a_failed_send_is_tried_again_with_nothing_else_due() -> None:
    """A send that failed is tried again after ``retry_delay``, though no
    other state falls due before ``min_interval`` (the publisher sleeps
    until something is due)."""
    import asyncio

    bus = RecordingBus()
    pub = Publisher(bus, min_interval=10.0, batch=0.0)
    stop = asyncio.Event()
    task = asyncio.create_task(pub.run(stop))
    bus.fail = True
    pub.offer_endpoint(ep(1))
    await asyncio.sleep(0.1)
    bus.fail = False
    for _ in range(50):
        if bus.puts:
            break
        await asyncio.sleep(0.02)
    assert [b["queued"] for _, _, b in bus.puts] == [1]
    stop.set()
    await task
