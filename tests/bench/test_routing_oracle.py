"""The router told everything (bench/routing/oracle.py): its probe is the
simulator's own answer, it sends a request where that answer is soonest,
and it never counts as a peer in the goal."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from bench.routing import oracle, run
from bench.routing.fleet import PodSpec, fleet, simulate
from bench.routing.workloads import SimRequest, TextFactory

REPO = Path(__file__).resolve().parents[2]


def _request(rid: str, tokens: int, *, t: float = 0.0, output: int = 8) -> SimRequest:
    text = TextFactory(7).text(random.Random(rid), tokens)
    return SimRequest(rid, t, text, len(text) // 4, output)


class _Probing(oracle.FullInformation):
    """Records each probe's answer for the pod it picked."""

    def pick(self, req: SimRequest, now: float) -> str | None:
        key = super().pick(req, now)
        self.probed = {k: oracle.probe_ttft(p, req, now) for k, p in self.fleet.items()}
        return key


def test_the_probe_of_a_request_nobody_follows_is_its_ttft() -> None:
    # a long prompt on pod-00 (first in the fleet's order), then a short one while it prefills
    reqs = [_request("long", 12_000), _request("short", 500, t=0.01)]
    router = _Probing()
    res = simulate(reqs, fleet(2), [router])
    out = {o.req.id: o for o in res.outcomes}
    assert out["long"].target == "default/ws/pod-00"
    # pod-00 is busy with the long prefill: the short one goes to the idle pod, as the probe said
    assert out["short"].target == "default/ws/pod-01"
    assert router.probed["default/ws/pod-01"] < router.probed["default/ws/pod-00"]
    # and the probe's answer is exactly what the run then measured (nothing arrived after it)
    assert router.probed["default/ws/pod-01"] == pytest.approx(out["short"].ttft, abs=1e-9)


def test_a_request_behind_a_busy_pod_is_probed_from_the_end_of_its_step() -> None:
    reqs = [_request("a", 8_000), _request("b", 200, t=0.001)]
    router = _Probing()
    res = simulate(reqs, [PodSpec("only", "ws", "m")], [router])
    b = next(o for o in res.outcomes if o.req.id == "b")
    assert router.probed["default/ws/only"] == pytest.approx(b.ttft, abs=1e-9)
    assert b.ttft > 0.4  # it waited for a's 8,000-token step


def test_the_comparison_leaves_the_full_information_router_out_of_the_goal() -> None:
    base = {"workload": "shared_prefix", "load": 0.8, "replicas": 1, "scrape_interval_s": 0.1, "seed": 1,
            "ttft_p50_s": 0.02, "goodput": 100.0, "idle_floor_p99_s": 0.02, "loaded_floor_p99_s": 0.036}
    rows = [dict(base, router="kinference", ttft_p99_s=0.052), dict(base, router="gie_default", ttft_p99_s=0.049),
            dict(base, router=oracle.NAME, ttft_p99_s=0.040, ttft_p50_s=0.001)]
    [c] = oracle.compare(rows)
    assert c["best_peer"] == "gie_default"  # not the full-information router, though its p99 is lower
    assert c["goal_p99_s"] == pytest.approx(0.036)
    assert c["full_information_p99_s"] == 0.040 and c["goal_below_full_information"]
    page = oracle.markdown([c], 1)
    assert "| shared_prefix | 0.8 | 0.052 s | gie_default (0.049 s) | 0.036 s (missed) | 0.040 s (0.001 s) | yes" \
        in page


def test_a_smoke_run_writes_the_comparison(tmp_path) -> None:  # noqa: ANN001
    out = tmp_path / "oracle.json"
    # a process of its own: the module re-executes itself with Python's string hashing pinned
    done = subprocess.run([sys.executable, "-m", "bench.routing.oracle", "--workloads", "trial", "--loads", "0.2",
                           "--jobs", "1", "--out", str(out), "--no-page"], cwd=REPO, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "trial" in done.stdout and "full information" in done.stdout
    rows = json.loads(out.read_text())
    assert {r["router"] for r in rows} == {oracle.NAME, *run.ROUTERS}
    full = next(r for r in rows if r["router"] == oracle.NAME)
    kin = next(r for r in rows if r["router"] == "kinference")
    assert full["requests"] == kin["requests"] > 0  # the same arrivals
    assert full["ttft_p99_s"] >= full["idle_floor_p99_s"] - 1e-9


def test_page_only_without_results_says_so(tmp_path) -> None:  # noqa: ANN001
    missing = tmp_path / "none.json"
    with pytest.raises(SystemExit, match=f"no results in {missing}"):
        oracle.main(["--page-only", "--out", str(missing)])
