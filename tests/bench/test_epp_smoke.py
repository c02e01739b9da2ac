"""``make bench-epp`` in small: the gateway targets start, serve plain and
streamed requests through a real Envoy (and the router's Endpoint Picker),
and the report names a verdict per goal. Figures are never asserted (a
shared machine); that the rows are complete and error-free is."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import epp
from bench.router import ensure_wrk

pytestmark = pytest.mark.timeout(180)


def test_bench_epp_smoke(tmp_path: Path) -> None:
    ensure_wrk()  # make install puts it there as root; never skipped: a skip would pass for nothing
    out = tmp_path / "epp.json"
    assert epp.main(["--targets", "direct", "envoy-direct", "envoy-kinference-epp", "envoy-null-epp",
                     "--duration", "1", "--warmup", "1", "--concurrency", "1", "16", "--no-competitors",
                     "--no-page", "--results", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    got = {(r["target"], r["mode"], r["concurrency"]) for r in rows}
    assert got == {(t, m, c) for t in ("direct", "envoy-direct", "envoy-kinference-epp", "envoy-null-epp")
                   for m in ("plain", "stream") for c in (1, 16)}
    for r in rows:
        assert "error" not in r, r
        assert r["requests"] > 0 and r["errors"] == 0, r
        if r["target"] in ("envoy-kinference-epp", "envoy-null-epp"):
            # Envoy's own counters: every request is one ext_proc stream with
            # at least headers and body each way, and as many answers
            # (counters read around the window: up to `concurrency` streams straddle each edge)
            per, n, edge = r["per_request"], r["requests"], 2 * r["concurrency"]
            assert n - edge <= per["streams_started"] * n <= n + edge, r
            assert per["stream_msgs_sent"] * n >= 4 * (n - edge), r
            assert per["stream_msgs_received"] * n >= 3 * (n - edge), r
        else:
            assert "per_request" not in r, r
    epp.annotate(rows)
    assert all("epp_added_p50_ms" in r for r in rows if r["target"] == "envoy-kinference-epp")
    assert "| envoy-kinference-epp | stream |" in epp.table(rows)
    # the transport floor: a stream and its messages cost the null picker CPU, the first more than one message
    f = json.loads(out.read_text())["transport_floor"]
    assert f["us_per_message"] > 0 and f["us_per_stream"] > f["us_per_message"], f
    assert f["us_per_request"] >= f["us_per_stream"], f


def test_page_block_is_rewritten_in_place() -> None:
    rows = [{"target": t, "mode": m, "concurrency": c, "rps": rps, "p50_ms": p50, "p99_ms": 1.0, "requests": 10,
             "errors": 0} for t, rps, p50 in (("direct", 100.0, 0.1), ("envoy-direct", 90.0, 0.3),
                                             ("envoy-kinference-epp", 80.0, 0.5), ("envoy-null-epp", 100.0, 0.4),
                                             ("kinference", 50.0, 0.4),
                                             ("vllm-router-round_robin", 70.0, 0.2))
            for m in ("plain", "stream") for c in (1, 64)]
    epp.annotate(rows)
    page = "# B\n\nbefore\n<!-- epp:results -->\nold\n<!-- /epp:results -->\nafter\n"
    new = epp.rewrite(page, rows, "today")
    assert new.startswith("# B\n\nbefore\n<!-- epp:results -->\n") and new.endswith("<!-- /epp:results -->\nafter\n")
    assert "old" not in new and "| envoy-kinference-epp | plain | 0.500 | 0.400 (EPP: 0.200) |" in new
    # 80 >= 1.5 x 50 is met; 80 >= round_robin's 70 is met; the EPP's 0.2 ms <= the router's 0.3 ms is met
    assert new.count("MET ") == 6 and "MISS" not in new
    # the null picker's rate is the ceiling: 100 req/s = 2.00x the router, the EPP at 80% of it
    assert "(bench.null_epp): 100 req/s = 2.00x the router; Kinference's picker reaches 80% of it" in new
    with_floor = epp.rewrite(page, rows, "today", {"us_per_stream": 400.0, "us_per_message": 60.0,
                                                   "us_per_request": 880.0})
    assert "400 us per ext_proc stream (one per request) plus 60 us per message" in with_floor
    assert "at most 1,136 requests/s on a core" in with_floor
    with pytest.raises(SystemExit, match="epp:results"):
        epp.rewrite("no block", rows, "today")
