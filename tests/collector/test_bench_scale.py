"""``make bench-scale``'s smoke: the real bench on 50 simulated pods and two
collector replicas for a few seconds (``--smoke``): the work split in two
equal shares, every pod scraped, none twice, and the row the results file
promises."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import scale

pytestmark = pytest.mark.nats

REPO = Path(__file__).resolve().parents[2]


def test_bench_scale_smoke_splits_the_fleet_and_writes_its_row(tmp_path: Path) -> None:
    out = tmp_path / "scale.json"
    page_before = scale.PAGE.read_text()
    proc = subprocess.run([sys.executable, "-m", "bench.scale", "--smoke", "--out", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    (row,) = result["rows"]
    for key in ("pods", "collectors", "interval_s", "scrapes_per_s", "cpu_s_per_1000_scrapes",
                "lag_p50_ms", "lag_p99_ms"):
        assert isinstance(row[key], int | float), key
    assert (row["pods"], row["collectors"]) == (50, 2)
    assert [p["targets"] for p in row["per_replica"]] == [25, 25]
    assert row["share_max_dev"] <= 0.10  # each of N replicas does 1/N of the scrapes
    assert row["pods_scraped"] == 50
    assert row["scrapes_per_pod_per_interval_max"] < 1.5  # no pod scraped twice
    assert row["lag_changes"] > 0 and row["lag_p50_ms"] > 0
    assert any(v.startswith("MET  2 replica(s)") for v in result["verdicts"])
    assert scale.PAGE.read_text() == page_before  # the smoke leaves the page alone


def test_the_page_block_is_rewritten_from_the_results() -> None:
    row = {"pods": 1000, "collectors": 2, "interval_s": 1.0, "scrapes_per_s": 990.0, "share_max_dev": 0.002,
           "per_replica": [{"share": 0.499, "cpu_cores": 0.4}, {"share": 0.501, "cpu_cores": 0.41}],
           "cpu_s_per_1000_scrapes": 0.8, "sustained_interval_s": 0.4, "cores_for_1000_pods_at_100ms": 8.0,
           "lag_p50_ms": 500.0, "lag_p99_ms": 990.0, "pipeline_lag_p50_ms": 3.0, "pipeline_lag_p99_ms": 20.0}
    result = {"rows": [row], "router": [], "api_server": None, "when": "today", "env": {"cpus": 2},
              "verdicts": scale.verdicts([row], [])}
    page = "intro\n<!-- scale:results -->\nold\n<!-- /scale:results -->\nafter\n"
    new = scale.rewrite(page, result)
    assert new.startswith("intro\n<!-- scale:results -->\nMeasured today") and new.endswith(
        "<!-- /scale:results -->\nafter\n")
    assert "| 1,000 | 2 | 1000 ms | 990 |" in new and "old" not in new
    assert "MISS 1,000 pods at 100 ms need at most 4 cores" in new
    with pytest.raises(SystemExit, match="no <!-- scale:results --> block"):
        scale.rewrite("no block", result)


def test_router_rows_time_the_rebuild_by_what_changed_and_render() -> None:
    """The router's rows at two small sizes: each kind of rebuild timed, the
    table shows them, and the verdict reads the largest size."""
    router = scale.router_costs([40, 120], 200)
    assert [r["endpoints"] for r in router] == [40, 120]
    for r in router:
        for key in ("rebuild_whole_ms", "rebuild_none_ms", "rebuild_1s_ms", "rebuild_100ms_ms",
                    "rebuild_cpu_share_busy_1s", "rebuild_cpu_share_busy_100ms", "apply_us_per_update",
                    "apply_us_per_update_every_pod"):
            assert r[key] > 0, key
        assert r["apply_changing_pods"] == 40  # the same pods change at each size: the smallest fleet's
    text = scale.table({"rows": [], "router": router, "api_server": None})
    r = router[1]
    assert (f"| 120 endpoints | {r['apply_us_per_update']:.1f} / {r['apply_us_per_update_every_pod']:.1f} us | "
            f"{r['rebuild_whole_ms']:.2f} / "
            f"{r['rebuild_none_ms']:.2f} / {r['rebuild_1s_ms']:.2f} / {r['rebuild_100ms_ms']:.2f} ms |") in text
    row = {"pods": 1000, "collectors": 1, "share_max_dev": 0.0, "cpu_s_per_1000_scrapes": 1.0,
           "cores_for_1000_pods_at_100ms": 3.0, "pipeline_lag_p99_ms": 20.0}
    (flat,) = [v for v in scale.verdicts([row], router) if "apply one update flat" in v]
    assert "the same 40 pods changing at each size; with every pod changing in turn" in flat
    (follows,) = [v for v in scale.verdicts([row], router) if "rebuild follows what changed" in v]
    assert "at 120 endpoints" in follows and f"{r['rebuild_whole_ms']:.1f} ms whole" in follows


def test_the_cores_verdict_reads_the_run_at_the_goals_interval() -> None:
    """With a run of one replica at 100 ms, the 4-core verdict is judged on it
    (10,000 scrapes a second at its CPU per scrape) and the table says it."""
    row = {"pods": 1000, "collectors": 1, "share_max_dev": 0.0, "cpu_s_per_1000_scrapes": 1.5,
           "cores_for_1000_pods_at_100ms": 15.0, "pipeline_lag_p99_ms": 20.0}
    goal = {"pods": 100, "collectors": 1, "scrapes_per_s": 990.0, "target_scrapes_per_s": 1000.0,
            "cpu_cores": 0.38, "cpu_s_per_1000_scrapes": 0.38, "cores_for_1000_pods_at_100ms": 3.8,
            "pipeline_lag_p50_ms": 5.0, "pipeline_lag_p99_ms": 30.0}
    (v,) = [v for v in scale.verdicts([row], [], None, goal) if "4 cores" in v]
    assert v.startswith("MET ") and "3.80" in v and "100 pods" in v
    (v,) = [v for v in scale.verdicts([row], [], None, dict(goal, cores_for_1000_pods_at_100ms=4.2)) if "4 cores" in v]
    assert v.startswith("MISS")
    (v,) = [v for v in scale.verdicts([row], [], None, None) if "4 cores" in v]
    assert v.startswith("MISS") and "15.00" in v
    text = scale.table({"rows": [], "router": [], "api_server": None, "goal_row": goal})
    assert "One replica at the goal's 100 ms on 100 pods" in text and "need 3.80 cores" in text


def test_the_flat_cpu_verdict_also_gives_the_costs_divided_by_each_runs_pause_cost() -> None:
    """The verdict stays on the CPU measured; beside it, each run's cost over
    the slowdown of work after that run's pause, measured in the same run."""
    rows = [{"pods": 1000, "collectors": n, "share_max_dev": 0.0, "cpu_s_per_1000_scrapes": cost,
             "parse_us_baseline": 100.0, "parse_us_after_gap": after,
             "cores_for_1000_pods_at_100ms": 10 * cost, "pipeline_lag_p99_ms": 20.0}
            for n, cost, after in ((1, 0.9, 150.0), (4, 1.3, 220.0))]
    (v,) = [v for v in scale.verdicts(rows, []) if "flat within 15%" in v]
    assert v.startswith("MISS") and "44.4%" in v
    assert "(1.50x / 2.20x) 0.600 / 0.591, within 2%" in v
    rows[1].pop("parse_us_after_gap")
    (v,) = [v for v in scale.verdicts(rows, []) if "flat within 15%" in v]
    assert "divided by" not in v


def test_the_apart_run_tells_replications_cost_from_the_machines() -> None:
    """As many replicas as the most, sharing nothing (each its own NATS and
    share of the pods), on a machine as busy: the change against it is what
    replication itself adds; the flat-CPU verdict is unchanged by it. Its row
    goes in the table, not in the replica rows."""
    rows = [{"pods": 1000, "collectors": n, "share_max_dev": 0.0, "cpu_s_per_1000_scrapes": cost,
             "cores_for_1000_pods_at_100ms": 10 * cost, "pipeline_lag_p99_ms": 20.0}
            for n, cost in ((1, 0.70), (4, 1.00))]
    apart = {"pods": 1000, "collectors": 4, "role": "apart", "cpu_s_per_1000_scrapes": 0.95}
    verdicts = scale.verdicts(rows, [], None, None, apart)
    (flat,) = [v for v in verdicts if "flat within 15%" in v]
    assert flat.startswith("MISS") and "42.9%" in flat
    (note,) = [v for v in verdicts if v.startswith("NOTE")]
    assert "4 replicas sharing 1,000 pods 1.000" in note and "each its own NATS server and 250 of the pods" in note
    assert "0.950: replication itself adds +5.3%" in note
    assert not [v for v in scale.verdicts(rows, []) if v.startswith("NOTE")]
    full = dict(rows[1], interval_s=2.5, scrapes_per_s=400.0, per_replica=[{"share": 1.0, "cpu_cores": 0.2}],
                sustained_interval_s=0.2, lag_p50_ms=1.0, lag_p99_ms=2.0, pipeline_lag_p50_ms=1.0)
    text = scale.table({"rows": [full], "control_row": dict(full, **apart), "router": [], "api_server": None})
    assert "| 1,000 | 4 apart (each its own NATS, 1/4 of the pods) | 2500 ms |" in text


def test_each_replica_count_is_judged_on_its_median_run() -> None:
    """Runs of the same count move by up to a fifth here: the row is the
    median run, the verdict says so and gives every run."""
    runs = [{"collectors": 4, "cpu_s_per_1000_scrapes": c, "marker": c} for c in (0.9, 0.6, 0.7)]
    row = scale.median_row(runs)
    assert row["marker"] == 0.7 and row["cpu_s_per_1000_scrapes_runs"] == [0.9, 0.6, 0.7]
    assert scale.median_row(runs[:2])["marker"] == 0.6  # the lower middle of an even number
    rows = [{"pods": 1000, "collectors": n, "share_max_dev": 0.0, "cpu_s_per_1000_scrapes": med,
             "cpu_s_per_1000_scrapes_runs": every, "cores_for_1000_pods_at_100ms": 10 * med,
             "pipeline_lag_p99_ms": 20.0}
            for n, med, every in ((1, 0.60, [0.60, 0.55, 0.80]), (4, 0.66, [0.90, 0.66, 0.62]))]
    (flat,) = [v for v in scale.verdicts(rows, []) if "flat within 15%" in v]
    assert flat.startswith("MET ") and "10.0%" in flat
    assert "0.600 / 0.660 s per 1,000, the median of 3 interleaved runs each; every run: " \
           "0.600 / 0.550 / 0.800; 0.900 / 0.660 / 0.620" in flat


def test_side_by_side_rounds_judge_the_flat_cpu_goal_on_each_rounds_own_figures() -> None:
    """When the counts ran side by side, each round's counts shared the same
    seconds of the machine: the verdict is the median of each round's largest
    change, not the change between medians of runs that ran at other times."""
    rows = [{"pods": 1000, "collectors": n, "share_max_dev": 0.0, "cpu_s_per_1000_scrapes": med,
             "cpu_s_per_1000_scrapes_runs": every, "cores_for_1000_pods_at_100ms": 10 * med,
             "pipeline_lag_p99_ms": 20.0}
            for n, med, every in ((1, 0.40, [0.50, 0.40, 0.30]), (4, 0.50, [0.55, 0.44, 0.36]))]
    # the medians of runs are 25% apart, but in every round the four replicas cost 10-20% more
    flat_by_round = [0.10, 0.10, 0.20]
    (flat,) = [v for v in scale.verdicts(rows, [], flat_by_round=flat_by_round) if "flat within 15%" in v]
    assert flat.startswith("MET ") and "the median of 3 rounds' largest change, 10.0%" in flat
    assert "0.500 / 0.550 (10.0%); 0.400 / 0.440 (10.0%); 0.300 / 0.360 (20.0%)" in flat
    (flat,) = [v for v in scale.verdicts(rows, [], flat_by_round=[0.2, 0.3, 0.1]) if "flat within 15%" in v]
    assert flat.startswith("MISS") and "20.0%" in flat
    # without rounds (an older results file), the medians' change as before
    (flat,) = [v for v in scale.verdicts(rows, []) if "flat within 15%" in v]
    assert flat.startswith("MISS") and "25.0%" in flat


def test_the_lag_verdict_reads_the_replicas_run_alone_when_there_is_one() -> None:
    """Side by side, four fleets and every run's router follower share the two
    cores; the lag goal is judged on the run of the most replicas alone, and
    the verdict gives the side-by-side worst beside it."""
    rows = [{"pods": 1000, "collectors": n, "share_max_dev": 0.0, "cpu_s_per_1000_scrapes": 0.5,
             "cores_for_1000_pods_at_100ms": 5.0, "pipeline_lag_p99_ms": lag}
            for n, lag in ((1, 945.2), (4, 40.0))]
    alone = {"pods": 1000, "collectors": 4, "pipeline_lag_p99_ms": 31.5}
    (v,) = [v for v in scale.verdicts(rows, [], lag=alone) if "publish lag" in v]
    assert v.startswith("MET ") and "31.5 ms (4 replicas alone" in v and "= 131.5 ms" in v and "up to 945.2 ms" in v
    (v,) = [v for v in scale.verdicts(rows, [], lag=dict(alone, pipeline_lag_p99_ms=120.0)) if "publish lag" in v]
    assert v.startswith("MISS")
    (v,) = [v for v in scale.verdicts(rows, []) if "publish lag" in v]
    assert v.startswith("MISS") and "945.2 ms" in v


def test_replications_own_cost_is_read_round_by_round_when_side_by_side() -> None:
    """Sharing and apart replicas of one round ran over the same seconds: the
    note compares them round by round (the median of the rounds), not the
    medians of runs from different rounds."""
    rows = [{"pods": 1000, "collectors": n, "share_max_dev": 0.0, "cpu_s_per_1000_scrapes": med,
             "cpu_s_per_1000_scrapes_runs": every, "cores_for_1000_pods_at_100ms": 10 * med,
             "pipeline_lag_p99_ms": 20.0}
            for n, med, every in ((1, 0.40, [0.40, 0.36, 0.44]), (4, 0.44, [0.44, 0.40, 0.48]))]
    apart = {"pods": 1000, "collectors": 4, "role": "apart", "cpu_s_per_1000_scrapes": 0.40,
             "cpu_s_per_1000_scrapes_runs": [0.40, 0.40, 0.32]}
    (note,) = [v for v in scale.verdicts(rows, [], None, None, apart, [0.1, 0.11, 0.09]) if v.startswith("NOTE")]
    # rounds: +10%, +0%, +50%: the median +10%, where the medians of runs say 0.44 / 0.40 = +10% too
    assert "adds +10.0% (the median of 3 rounds: 0.440 against 0.400, +10.0%; 0.400 against 0.400, +0.0%; " \
           "0.480 against 0.320, +50.0%)" in note
    apart["cpu_s_per_1000_scrapes_runs"] = [0.44, 0.40, 0.48]
    (note,) = [v for v in scale.verdicts(rows, [], None, None, apart, [0.1, 0.11, 0.09]) if v.startswith("NOTE")]
    assert "adds +0.0% (the median of 3 rounds" in note  # each round alike, though 0.44 / 0.40 medians differ
