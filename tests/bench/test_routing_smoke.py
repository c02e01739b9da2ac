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
