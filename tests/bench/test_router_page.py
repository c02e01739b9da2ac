"""``make bench-router``'s goals and the page block it writes from its
results (the routers themselves run only in the benchmark)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import router


def row(target: str, mode: str, conc: int, rps: float, p50: float, p99: float = 5.0, **kw: object) -> dict:
    return {"target": target, "mode": mode, "concurrency": conc, "rps": rps, "p50_ms": p50, "p99_ms": p99,
            "requests": 1000, "errors": 0, **kw}


def run(k_rps_plain: float = 9_000, k_p50: float = 0.45) -> list[dict]:
    rows = []
    for mode in ("plain", "stream"):
        rows += [row("direct", mode, 1, 4_000, 0.20), row("direct", mode, 64, 20_000, 3.0),
                 row("kinference", mode, 1, 2_000, k_p50, cpu_us_per_request=95.0),
                 row("kinference", mode, 64, k_rps_plain if mode == "plain" else 8_200, 7.0),
                 row("vllm-router-round_robin", mode, 1, 2_500, 0.42),
                 row("vllm-router-round_robin", mode, 64, 10_000 if mode == "plain" else 8_000, 5.0),
                 row("vllm-router-cache_aware", mode, 64, 7_000, 9.0),
                 {"target": "litellm", "mode": mode, "concurrency": 64, "error": "not run (--no-competitors)"}]
    router.annotate(rows)
    return rows


def test_the_goals_are_the_issues() -> None:
    got = router.verdicts(run())
    assert got[0].startswith("MISS plain  c=1  added p50 0.250 ms <= vllm-router round_robin's 0.220 ms (1.14x)")
    assert "MET  plain  c=64 9000 req/s >= 0.9x vllm-router round_robin's 10000 (0.90x)" in got
    assert "MET  stream c=64 8200 req/s >= 1x vllm-router round_robin's 8000 (1.02x)" in got
    assert "MET  plain  c=64 9000 req/s > vllm-router cache_aware's 7000 (1.29x)" in got
    slow = router.verdicts(run(k_rps_plain=8_900, k_p50=0.40))
    assert any(v.startswith("MISS plain  c=64 8900 req/s >= 0.9x") for v in slow)
    assert slow[0].startswith("MET  plain  c=1  added p50 0.200 ms")
    # a target that did not run leaves its goals out rather than failing them
    assert router.verdicts([r for r in run() if r["target"] != "vllm-router-cache_aware"]) == [
        v for v in got if "cache_aware" not in v]


def test_the_page_block_is_rewritten_from_the_rows_and_nothing_else() -> None:
    page = "# Benchmarks\n\nbefore\n\n<!-- router:results -->\nold figures\n<!-- /router:results -->\n\nafter\n"
    out = router.rewrite_results(page, run(), "2026-12-03 08:00 UTC")
    assert out is not None and "old figures" not in out
    assert out.startswith("# Benchmarks\n\nbefore\n\n<!-- router:results -->\nMeasured 2026-12-03 08:00 UTC")
    assert out.endswith("<!-- /router:results -->\n\nafter\n")
    assert "| kinference | plain | 64 | 9000 | 7.000 | 5.000 | 4.000 | - | 0.90x | 2.00x |" in out
    assert "| direct | plain | 1 | 4000 | 0.200 | 5.000 | - | - | 1.60x | - |" in out
    assert "| litellm | plain | 64 | not measured: not run (--no-competitors) |" in out
    assert "- MET  stream c=64 8200 req/s >= 1x" in out
    assert router.rewrite_results("no block here", run(), "now") is None


def test_page_only_reads_the_results_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    results, page = tmp_path / "router.json", tmp_path / "benchmarks.md"
    monkeypatch.setattr(router, "RESULTS", results)
    monkeypatch.setattr(router, "PAGE", page)
    monkeypatch.setattr(router.harness, "REPO", tmp_path)
    page.write_text("<!-- router:results -->\n<!-- /router:results -->\n")
    assert router.main(["--page-only"]) == 1  # no results yet
    assert "run make bench-router first" in capsys.readouterr().err
    results.write_text(json.dumps(run()))
    assert router.main(["--page-only"]) == 0
    assert "| vllm-router-cache_aware | stream | 64 | 7000 |" in page.read_text()
    assert "rewrote the results block" in capsys.readouterr().out


def test_the_transport_alone_is_reported_as_a_ceiling_not_a_goal() -> None:
    rows = run()
    rows += [row("kinference-null", "plain", 1, 3_000, 0.30, cpu_us_per_request=40.0),
             row("kinference-null", "plain", 64, 12_000, 5.0, cpu_us_per_request=60.0)]
    for r in rows:
        if r["target"] == "kinference" and r["mode"] == "plain" and r["concurrency"] == 64:
            r["cpu_us_per_request"] = 110.0
    router.annotate(rows)
    got = router.verdicts(rows)
    assert [v for v in got if v.startswith("ceiling")] == [
        "ceiling plain  c=1  the transport alone (bench.null_router) adds 0.100 ms p50 = 0.45x round_robin's; "
        "the rest of the router adds 0.150 ms more",
        "ceiling plain  c=64 the transport alone 12000 req/s = 1.20x round_robin's; Kinference reaches 75% of it "
        "(CPU per request 110 against 60 us: 50 us for the rest of the router's work)"]
    # the goals are the same with or without it
    assert [v for v in got if not v.startswith("ceiling")] == router.verdicts(run())
