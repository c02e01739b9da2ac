"""A pod that comes back is used again as soon as telemetry scraped it after
its ejection, not after a backoff that doubled while it was down."""

from __future__ import annotations

from kinference_common.engine import InFlightLedger
from kinference_common.messages import EndpointState
from kinference_router.state import SnapshotKeeper
from kinference_router.upstream import UpstreamHealth

KEY = "default/qwen/q0"


def state(scraped_at: float, ready: bool = True) -> EndpointState:
    return EndpointState(namespace="default", worker_set="qwen", pod="q0", address="127.0.0.1:1", model="m",
                         ready=ready, scraped_at=scraped_at)


def test_a_scrape_after_the_ejection_ends_it_and_an_older_one_does_not() -> None:
    mono, wall = [100.0], [1000.0]
    health = UpstreamHealth(clock=lambda: mono[0], wall=lambda: wall[0])
    keeper = SnapshotKeeper("default", "pool", InFlightLedger(), ejected=health.excluded,
                            healthy=health.seen_healthy)
    for _ in range(3):
        ejected = health.connect_failed(KEY)
    assert ejected and health.excluded() == {KEY}
    keeper.set_endpoint(state(scraped_at=999.5))  # the scrape before the pod died
    keeper.set_endpoint(state(scraped_at=1001.0, ready=False))  # scraped, but not ready
    assert health.excluded() == {KEY}
    keeper.set_endpoint(state(scraped_at=1000.5))  # back: scraped after the ejection
    assert health.excluded() == set()
    # failing again: ejected again, for longer (the backoff was kept)
    for _ in range(3):
        health.connect_failed(KEY)
    assert health.excluded() == {KEY}
    mono[0] += 1.5
    assert health.excluded() == {KEY}  # the second ejection lasts 2 s, not 1
    mono[0] += 1.0
    assert health.excluded() == set()
