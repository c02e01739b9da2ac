"""A few seconds of the fleet benchmark (``make bench-routing``): rows have
the documented shape, runs are deterministic, and routing behaves sensibly.
Asserts behaviour, never timings."""

from __future__ import annotations

import pytest

from bench.routing import run
from bench.routing.fleet import fleet, simulate
from bench.routing.workloads import generate

ROW_KEYS = {"workload", "router", "load", "replicas", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "e2e_p50_s",
            "e2e_p99_s", "output_tokens_per_s", "goodput", "prefix_hit_rate", "preemptions"}

SMOKE = run.WorkloadSpec("shared_prefix", lambda: fleet(4, blocks=2048), duration=8.0, ttft_slo=0.5, warmup=1.0)


@pytest.fixture(scope="module")
def rows() -> dict[str, dict]:
    out = {}
    reqs = generate("shared_prefix", 3, 40.0, SMOKE.duration)
    for name in run.ROUTERS:
        res = simulate(reqs, SMOKE.pods(), [run.make_router(name)], seed=3)
        row = {"workload": "shared_prefix", "router": name, "load": 0.5, "replicas": 1}
        row.update(run.metrics(res, SMOKE))
        out[name] = row
    return out


def test_rows_have_the_documented_fields(rows: dict[str, dict]) -> None:
    assert set(rows) == {"round_robin", "least_queue", "gie_default", "llmd_sticky",
                         "vllm_router_cache_aware", "kinference"}
    for row in rows.values():
        assert ROW_KEYS <= set(row)
        assert row["requests"] > 100 and row["rejected"] == 0
        assert 0 < row["ttft_p50_s"] <= row["ttft_p90_s"] <= row["ttft_p99_s"]
        assert row["e2e_p50_s"] <= row["e2e_p99_s"]
        assert 0.0 <= row["prefix_hit_rate"] <= 1.0


def test_prefix_aware_routers_hit_the_cache_more_than_round_robin(rows: dict[str, dict]) -> None:
    rr = rows["round_robin"]["prefix_hit_rate"]
    for name in ("gie_default", "llmd_sticky", "vllm_router_cache_aware", "kinference"):
        assert rows[name]["prefix_hit_rate"] > rr + 0.05, name
    # and prefix hits make first tokens faster
    assert rows["kinference"]["ttft_p50_s"] < rows["round_robin"]["ttft_p50_s"]


def test_round_robin_spreads_requests_evenly(rows: dict[str, dict]) -> None:
    assert rows["round_robin"]["load_cv"] < 0.05


def test_the_same_seed_gives_the_same_numbers() -> None:
    def once() -> tuple:
        reqs = generate("chat", 5, 3.0, 4.0)
        res = simulate(reqs, fleet(2, blocks=2048), [run.make_router("kinference")], seed=5)
        return tuple((o.target, o.first_token, o.finished) for o in res.outcomes)

    assert once() == once()


def test_unknown_workload_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown workload 'nope'"):
        generate("nope", 1, 1.0, 1.0)


def test_replicas_sharing_over_the_simulated_bus_keep_the_prefix_hits() -> None:
    """Three Kinference replicas, arrivals round robin: without sharing each
    prefix index knows a third of the picks and the hit rate falls; with
    replica sync (publish, 2 ms delivery) the peers' picks are known."""
    from bench.routing.kinference import Kinference, ReplicaShare, link

    reqs = generate("shared_prefix", 3, 40.0, SMOKE.duration)

    def hit_rate(routers: list) -> float:
        res = simulate(reqs, SMOKE.pods(), routers, seed=3)
        return run.metrics(res, SMOKE)["prefix_hit_rate"]

    alone = hit_rate([Kinference() for _ in range(3)])
    shared = [Kinference(share=ReplicaShare()) for _ in range(3)]
    link(shared)
    together = hit_rate(shared)
    assert together > alone + 0.02
    assert all(len(r.ledger.peers) == 2 for r in shared)  # each merged both others


def test_peers_learn_of_each_send_within_the_routers_sync_interval() -> None:
    """Fix 15 (docs/routing-benchmark.md): a replica's send or first token
    reaches its peers at most the sync interval plus the bus's delivery
    later. With the router's default (5 ms) that is 7 ms; with the 50 ms
    it had, up to 52 ms, and three replicas routed ``chat`` 1.27x worse
    than one router (TTFT p99), 1.12x with 5 ms. The simulation uses the
    router's own default, so the benchmark measures what ships."""
    from bench.routing.fleet import EPOCH
    from bench.routing.kinference import Kinference, ReplicaShare, link
    from kinference_router.replica_sync import DEFAULT_INTERVAL, ReplicaSync

    share = ReplicaShare()
    assert ReplicaSync.__init__.__kwdefaults__["interval"] == DEFAULT_INTERVAL == share.interval
    reqs = generate("shared_prefix", 3, 40.0, SMOKE.duration)
    shared = [Kinference(share=share) for _ in range(3)]
    link(shared)
    first_seen: dict[tuple[str, float], float] = {}  # (sender, sent_at) -> when a peer first merged it

    def spy(router: Kinference) -> None:
        receive = router._receive

        def _receive(replica, seq, summary, records, now):  # noqa: ANN001, ANN202
            for e in summary:
                for sent_at in [s for s, _ in e.pending] + [s for s, _ in e.prefilled]:
                    first_seen.setdefault((replica, sent_at), now)
            receive(replica, seq, summary, records, now)

        router._receive = _receive

    for r in shared:
        spy(r)
    simulate(reqs, SMOKE.pods(), shared, seed=3)
    lags = [now - (sent_at - EPOCH) for (_, sent_at), now in first_seen.items()]
    assert len(lags) > 200
    assert max(lags) <= share.interval + share.delay + 1e-9
    assert max(lags) <= 0.010  # what the benchmark's gain needs (fix 15: 2 ms and 5 ms alike, 10 ms less)
    assert max(lags) > share.delay  # some waited for the interval: the bound is what is tested
