"""The collector against a real nats-server and real aiohttp servers on localhost."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import msgspec
import nats
import pytest

from kinference_collector import pages
from kinference_collector.derive import DeriveConfig
from kinference_collector.discovery import ListDiscovery, Target
from kinference_collector.publish import NatsBus, Publisher
from kinference_collector.service import Collector, CollectorConfig
from kinference_common import bus, subjects
from kinference_common.messages import EndpointState, Observation, ProviderState, encode

pytestmark = pytest.mark.nats

INTERVAL = 0.1
#: how long a test waits for something that should take a fraction of a second
#: (a bound against hanging, not a performance assertion)
PATIENCE = 15.0

ep_decoder = msgspec.json.Decoder(EndpointState)


def target(server: Any, pod: str, ns: str = "ns", ws: str = "llama") -> Target:
    return Target(namespace=ns, worker_set=ws, pod=pod, address=server.address, model=server.page.model)


class Watch:
    """Every endpoint state published on the subjects, per pod, in order."""

    def __init__(self) -> None:
        self.states: dict[str, list[EndpointState]] = {}
        self.changed = asyncio.Event()

    async def cb(self, msg: Any) -> None:
        st = ep_decoder.decode(msg.data)
        self.states.setdefault(st.pod, []).append(st)
        self.changed.set()

    async def until(self, pred: Callable[[], Any]) -> Any:
        async with asyncio.timeout(PATIENCE):
            while True:
                got = pred()
                if got:
                    return got
                self.changed.clear()
                await self.changed.wait()

    def first(self, pod: str, pred: Callable[[EndpointState], bool]) -> EndpointState | None:
        return next((s for s in self.states.get(pod, []) if pred(s)), None)


@pytest.fixture
async def nc(nats_server: Any) -> AsyncIterator[Any]:
    client = await nats.connect(nats_server.url)
    yield client
    await client.drain()


@pytest.fixture
async def watch(nc: Any) -> Watch:
    w = Watch()
    await nc.subscribe(f"{subjects.TELEMETRY_ENDPOINT_PREFIX}.>", cb=w.cb)
    return w


@pytest.fixture
async def collector(nats_server: Any) -> AsyncIterator[Callable[..., Awaitable[Collector]]]:
    made: list[tuple[Collector, Any]] = []

    async def make(targets: list[Target], **kw: Any) -> Collector:
        client = await nats.connect(nats_server.url, reconnect_time_wait=0.1, max_reconnect_attempts=-1)
        nats_bus = NatsBus(client)
        await nats_bus.start()
        derive = kw.pop("derive", DeriveConfig(window=5.0, stale_after=1.0))
        cfg = CollectorConfig(interval=INTERVAL, timeout=0.3, derive=derive, **kw)
        c = Collector(cfg, ListDiscovery(targets), Publisher(nats_bus, cfg.min_publish_interval))
        await c.start()
        made.append((c, client))
        return c

    yield make
    for c, client in made:
        await c.stop()
        await client.drain()


async def test_change_reaches_subject_within_two_scrapes_and_kv_soon(
    page_server: Any, collector: Any, watch: Watch, nc: Any
) -> None:
    srv = await page_server(pages.VllmPage(running=1, waiting=0, kv_usage=0.1))
    await collector([target(srv, "llama-0")])
    first = await watch.until(lambda: watch.first("llama-0", lambda s: s.ready))
    assert (first.running, first.queued, first.kv_cache_usage) == (1, 0, 0.1)
    assert first.kv_capacity_tokens == 8192 * 16 and first.address == srv.address

    srv.page.waiting = 7
    srv.page.kv_usage = 0.55
    served_at_change = srv.requests
    seen = await watch.until(lambda: watch.first("llama-0", lambda s: s.queued == 7))
    # the change was published from the first scrape after it (one more may be under way)
    assert srv.requests - served_at_change <= 2
    assert seen.kv_cache_usage == 0.55 and seen.ready
    # the KV copy (for starting routers) is written at most once a second: it gets there
    kv = await nc.jetstream().key_value(subjects.TELEMETRY_BUCKET)
    async with asyncio.timeout(PATIENCE):
        while True:
            entry = await kv.get(subjects.endpoint_key("ns", "llama", "llama-0"))
            stored = ep_decoder.decode(entry.value)
            if stored.queued == 7:
                break
            await asyncio.sleep(0.05)
    assert stored.pod == "llama-0" and stored.kv_cache_usage == 0.55
    # the context window comes from /v1/models
    got = await watch.until(lambda: watch.first("llama-0", lambda s: s.context_window == 32768))
    assert got.context_window == 32768


async def test_killed_target_goes_stale_then_not_ready(
    page_server: Any, collector: Any, watch: Watch
) -> None:
    srv = await page_server(pages.VllmPage(running=3, waiting=2))
    await collector([target(srv, "llama-0")])
    await watch.until(lambda: watch.first("llama-0", lambda s: s.ready and s.running == 3))
    await srv.stop()
    stale = await watch.until(lambda: watch.first("llama-0", lambda s: s.scrape_errors >= 2))
    assert stale.ready, "still ready while within the staleness bound"
    assert stale.running == 3 and stale.queued == 2, "last known values kept"
    assert stale.last_error
    gone = await watch.until(lambda: watch.first("llama-0", lambda s: not s.ready))
    assert gone.scrape_errors > stale.scrape_errors
    assert gone.scraped_at == stale.scraped_at
    errors = [s.scrape_errors for s in watch.states["llama-0"] if s.scrape_errors]
    assert errors == sorted(errors)


@pytest.mark.parametrize("mode", ["huge", "huge_chunked", "slow", "drip", "garbage", "http500", "gzip"])
async def test_hostile_page_does_not_affect_others(
    page_server: Any, collector: Any, watch: Watch, mode: str
) -> None:
    good = await page_server(pages.VllmPage(running=2, waiting=1))
    bad = await page_server(mode=mode)
    c = await collector([target(good, "good-0"), target(bad, "bad-0")], max_body_bytes=1 << 20)
    bad_state = await watch.until(lambda: watch.first("bad-0", lambda s: s.scrape_errors >= 3))
    assert not bad_state.ready and bad_state.last_error
    # meanwhile the good endpoint kept being scraped, with no error
    served = good.requests
    await watch.until(lambda: good.requests >= served + 3)
    good_states = watch.states["good-0"]
    assert good_states and all(s.scrape_errors == 0 for s in good_states)
    assert good_states[-1].ready and good_states[-1].running == 2
    assert c.metrics.scrape_errors_vllm._value.get() >= 3  # type: ignore[attr-defined]
    assert c.running


async def test_dcgm_attaches_gpu_state_to_the_pod(page_server: Any, collector: Any, watch: Watch) -> None:
    engine = await page_server(pages.VllmPage())
    dcgm = await page_server()
    dcgm.text = pages.render_dcgm([
        pages.Gpu(0, "GPU-0", "ns", "llama-0", util_percent=40, fb_used=20000, fb_free=60000, fb_reserved=0),
        pages.Gpu(1, "GPU-1", "ns", "llama-0", util_percent=90, fb_used=60000, fb_free=20000, fb_reserved=0, xid=79),
        pages.Gpu(2, "GPU-2", "ns", "other-0", util_percent=10),
    ], hostname_label="hostname", pod_label="pod_name", namespace_label="pod_namespace")
    await collector([target(engine, "llama-0"), Target(kind="dcgm", address=dcgm.address)],
                    dcgm_interval=0.1)
    st = await watch.until(lambda: watch.first("llama-0", lambda s: s.gpu_utilization is not None))
    assert (st.gpu_utilization, st.gpu_memory_usage, st.xid_error) == (0.9, 0.75, 79)


async def test_an_unchanged_dcgm_page_is_not_parsed_again_and_a_changed_one_is(
        page_server: Any, collector: Any, watch: Watch) -> None:
    """The exporter serves its last collection until the next (30 s by
    default): the same page is counted and skipped, a new one is read."""
    engine = await page_server(pages.VllmPage())
    dcgm = await page_server()

    def page(util: int) -> str:
        return pages.render_dcgm([pages.Gpu(0, "GPU-0", "ns", "llama-0", util_percent=util, fb_used=20000,
                                            fb_free=60000, fb_reserved=0)],
                                 hostname_label="hostname", pod_label="pod_name", namespace_label="pod_namespace")
    dcgm.text = page(40)
    c = await collector([target(engine, "llama-0"), Target(kind="dcgm", address=dcgm.address)],
                        dcgm_interval=0.05)
    await watch.until(lambda: watch.first("llama-0", lambda s: s.gpu_utilization == 0.4))
    unchanged = c.metrics.dcgm_unchanged
    async with asyncio.timeout(PATIENCE):
        while unchanged._value.get() < 3:  # type: ignore[attr-defined]
            await asyncio.sleep(0.05)
    assert c.metrics.scrape_errors.labels("dcgm")._value.get() == 0  # type: ignore[attr-defined]
    dcgm.text = page(70)
    await watch.until(lambda: watch.first("llama-0", lambda s: s.gpu_utilization == 0.7))


async def test_endpoint_removed_from_discovery(page_server: Any, collector: Any, watch: Watch, nc: Any) -> None:
    a = await page_server(pages.VllmPage())
    b = await page_server(pages.VllmPage())
    c = await collector([target(a, "a-0"), target(b, "b-0")])
    await watch.until(lambda: watch.first("b-0", lambda s: s.ready))
    c.apply_targets([target(a, "a-0")])
    await watch.until(lambda: watch.states["b-0"][-1].ready is False)
    kv = await nc.jetstream().key_value(subjects.TELEMETRY_BUCKET)

    async def key_gone() -> bool:
        try:
            await kv.get(subjects.endpoint_key("ns", "llama", "b-0"))
        except Exception:  # KeyNotFoundError / KeyDeletedError
            return True
        return False

    async with asyncio.timeout(PATIENCE):
        while not await key_gone():
            await asyncio.sleep(0.05)
    assert await kv.get(subjects.endpoint_key("ns", "llama", "a-0"))


async def test_provider_state_from_observations(collector: Any, nc: Any) -> None:
    c = await collector([])
    got: list[ProviderState] = []
    arrived = asyncio.Event()
    dec = msgspec.json.Decoder(ProviderState)

    async def cb(msg: Any) -> None:
        got.append(dec.decode(msg.data))
        arrived.set()

    await nc.subscribe(f"{subjects.TELEMETRY_PROVIDER_PREFIX}.>", cb=cb)
    subj = subjects.observations_subject("ns", "pool")
    # subscribe the collector directly (the service does this on its connection)
    sub_client = await nats.connect(nc.connected_url.geturl())

    async def feed(msg: Any) -> None:
        c.on_observation(msg.data)

    await sub_client.subscribe(f"{subjects.OBSERVATIONS_PREFIX}.>", cb=feed)
    await bus.sync(sub_client)
    for ttft in (0.5, 2.0):
        await nc.publish(subj, encode(Observation(decision_id="d", namespace="ns", pool="pool",
                                                  backend_type="Provider", backend_name="databricks",
                                                  outcome="ok", ttft_seconds=ttft)))
    await nc.publish(subj, encode(Observation(decision_id="e", namespace="ns", pool="pool",
                                              backend_type="Provider", backend_name="databricks",
                                              outcome="error")))
    await nc.publish(subj, b"{not json")
    await nc.publish(subj, encode(Observation(decision_id="f", namespace="ns", pool="pool",
                                              backend_type="Local", backend_name="llama", outcome="ok",
                                              ttft_seconds=0.1)))
    async with asyncio.timeout(PATIENCE):
        while not (got and got[-1].observations == 3):
            arrived.clear()
            await arrived.wait()
    last = got[-1]
    assert last.name == "databricks" and last.namespace == "ns"
    assert last.estimated_ttft_seconds == pytest.approx(1.0, rel=1e-3)
    assert last.error_rate == pytest.approx(1 / 3)
    kv = await nc.jetstream().key_value(subjects.TELEMETRY_BUCKET)
    stored = dec.decode((await kv.get(subjects.provider_key("ns", "databricks"))).value)
    assert stored.observations == 3
    assert c.metrics.observations.labels("invalid")._value.get() == 1  # type: ignore[attr-defined]
    await sub_client.drain()


async def test_router_can_build_snapshot_from_kv(page_server: Any, collector: Any, watch: Watch, nc: Any) -> None:
    servers = [await page_server(pages.VllmPage(waiting=i)) for i in range(3)]
    await collector([target(s, f"p-{i}") for i, s in enumerate(servers)])
    await watch.until(lambda: all(watch.first(f"p-{i}", lambda s: s.ready) for i in range(3)))
    kv = await nc.jetstream().key_value(subjects.TELEMETRY_BUCKET)
    keys = sorted(await kv.keys())
    assert keys == [f"endpoint.ns.llama.p-{i}" for i in range(3)]
    for i in range(3):
        st = ep_decoder.decode((await kv.get(f"endpoint.ns.llama.p-{i}")).value)
        assert st.queued == i


async def test_nats_outage_then_state_catches_up(page_server: Any, collector: Any, nats_server: Any) -> None:
    srv = await page_server(pages.VllmPage(waiting=1))
    c = await collector([target(srv, "llama-0")])
    key = subjects.endpoint_key("ns", "llama", "llama-0")

    async def kv_state(url: str) -> EndpointState | None:
        client = await nats.connect(url)
        try:
            kv = await client.jetstream().key_value(subjects.TELEMETRY_BUCKET)
            return ep_decoder.decode((await kv.get(key)).value)
        except Exception:
            return None
        finally:
            await client.close()

    async def until_kv(pred: Callable[[EndpointState], bool]) -> EndpointState:
        async with asyncio.timeout(PATIENCE):
            while True:
                st = await kv_state(nats_server.url)
                if st is not None and pred(st):
                    return st
                await asyncio.sleep(0.1)

    await until_kv(lambda s: s.queued == 1)
    nats_server.kill()
    srv.page.waiting = 9
    served = srv.requests
    async with asyncio.timeout(PATIENCE):  # scraping goes on without NATS
        while srv.requests < served + 5:
            await asyncio.sleep(0.05)
    assert c.running
    nats_server.restart()
    st = await until_kv(lambda s: s.queued == 9)
    assert st.ready


async def test_discovery_changes_are_picked_up(page_server: Any, collector: Any, watch: Watch) -> None:
    a = await page_server(pages.VllmPage())
    b = await page_server(pages.VllmPage(waiting=4))
    c = await collector([target(a, "a-0")], discovery_interval=0.1)
    await watch.until(lambda: watch.first("a-0", lambda s: s.ready))
    c.discovery.targets.append(target(b, "b-0"))  # type: ignore[attr-defined]
    st = await watch.until(lambda: watch.first("b-0", lambda s: s.ready))
    assert st.queued == 4
    # Kubernetes says the pod is not ready: published not ready, scraping goes on
    c.discovery.targets[1] = msgspec.structs.replace(target(b, "b-0"), ready=False)  # type: ignore[attr-defined]
    st = await watch.until(lambda: watch.states["b-0"][-1].ready is False and watch.states["b-0"][-1])
    assert st.scrape_errors == 0 and st.queued == 4


async def test_publish_counters_follow_what_was_sent(page_server: Any, collector: Any, watch: Watch) -> None:
    """kinference_collector_published_total{kind} and _kv_writes_total count
    what went to NATS (the first was defined and never moved)."""
    srv = await page_server(pages.VllmPage(running=1, waiting=0))
    c = await collector([target(srv, "llama-0")])
    await watch.until(lambda: watch.first("llama-0", lambda s: s.ready))
    for q in (3, 4):
        srv.page.waiting = q
        await watch.until(lambda: watch.first("llama-0", lambda s: s.queued == q))  # noqa: B023
    c.update_gauges()
    reg = c.metrics.registry
    sent = reg.get_sample_value("kinference_collector_published_total", {"kind": "endpoint"})
    writes = reg.get_sample_value("kinference_collector_kv_writes_total")
    assert sent is not None and sent >= 3 and sent == c.publisher.sent_by_kind["endpoint"]
    assert writes is not None and 1 <= writes <= sent and writes == c.publisher.stored
    c.update_gauges()  # counted once, not again
    assert reg.get_sample_value("kinference_collector_published_total", {"kind": "endpoint"}) == \
        c.publisher.sent_by_kind["endpoint"]
