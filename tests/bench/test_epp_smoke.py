"""``make bench-epp`` in small: the gateway targets start, serve plain and
streamed requests through a real Envoy (and the router's Endpoint Picker),
and the report names a verdict per goal. Figures are never asserted (a
shared machine); that the rows are complete and error-free is."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bench import epp

pytestmark = pytest.mark.timeout(180)


@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk not installed (make bench-epp installs it)")
def test_bench_epp_smoke(tmp_path: Path) -> None:
    out = tmp_path / "epp.json"
    assert epp.main(["--targets", "direct", "envoy-direct", "envoy-kinference-epp",
                     "--duration", "1", "--warmup", "1", "--concurrency", "1", "16", "--no-competitors",
                     "--no-page", "--results", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    got = {(r["target"], r["mode"], r["concurrency"]) for r in rows}
    assert got == {(t, m, c) for t in ("direct", "envoy-direct", "envoy-kinference-epp")
                   for m in ("plain", "stream") for c in (1, 16)}
    for r in rows:
        assert "error" not in r, r
        assert r["requests"] > 0 and r["errors"] == 0, r
    epp.annotate(rows)
    assert all("epp_added_p50_ms" in r for r in rows if r["target"] == "envoy-kinference-epp")
    assert "| envoy-kinference-epp | stream |" in epp.table(rows)


def test_page_block_is_rewritten_in_place() -> None:
    rows = [{"target": t, "mode": m, "concurrency": c, "rps": rps, "p50_ms": p50, "p99_ms": 1.0, "requests": 10,
             "errors": 0} for t, rps, p50 in (("direct", 100.0, 0.1), ("envoy-direct", 90.0, 0.3),
                                             ("envoy-kinference-epp", 80.0, 0.5), ("kinference", 50.0, 0.4),
                                             ("vllm-router-round_robin", 70.0, 0.2))
            for m in ("plain", "stream") for c in (1, 64)]
    epp.annotate(rows)
    page = "# B\n\nbefore\n<!-- epp:results -->\nold\n<!-- /epp:results -->\nafter\n"
    new = epp.rewrite(page, rows, "today")
    assert new.startswith("# B\n\nbefore\n<!-- epp:results -->\n") and new.endswith("<!-- /epp:results -->\nafter\n")
    assert "old" not in new and "| envoy-kinference-epp | plain | 0.500 | 0.400 (EPP: 0.200) |" in new
    # 80 >= 1.5 x 50 is met; 80 >= round_robin's 70 is met; the EPP's 0.2 ms <= the router's 0.3 ms is met
    assert new.count("MET ") == 6 and "MISS" not in new
    with pytest.raises(SystemExit, match="epp:results"):
        epp.rewrite("no block", rows, "today")
