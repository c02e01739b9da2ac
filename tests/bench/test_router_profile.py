"""``make profile-router``'s accounting of py-spy's samples (py-spy and the
router run only in the benchmark)."""

from __future__ import annotations

import json

from bench import router_profile as rp

UPSTREAM_WRITE = ("<module> (kinference_router/__main__.py:10);run (asyncio/runners.py:118);"
                  "_run_once (asyncio/base_events.py:1900);send (kinference_common/upstream_http.py:300);"
                  "write (asyncio/selector_events.py:1000)")
DECIDE = ("<module> (kinference_router/__main__.py:10);_route (kinference_router/app.py:290);"
          "decide (kinference_common/engine/decide.py:120);predict (kinference_common/engine/ttft.py:90)")
RECORD = ("run (asyncio/events.py:80);publish_decision (kinference_router/director.py:231);"
          "encode_trace (kinference_common/engine/trace.py:250)")
LOOP = "run (asyncio/runners.py:118);_run_once (asyncio/base_events.py:1900)"


def test_each_sample_goes_to_the_innermost_part_it_is_in() -> None:
    assert rp.part_of(UPSTREAM_WRITE) == "upstream client"  # not the event loop the write is under
    assert rp.part_of(DECIDE) == "decide (engine)"
    assert rp.part_of(RECORD) == "decision event and record"
    assert rp.part_of(LOOP) == "event loop"
    assert rp.part_of("gc_collect (<native>)") == rp.OTHER


def test_charge_and_breakdown_turn_samples_into_microseconds() -> None:
    raw = [f"{UPSTREAM_WRITE} 30\n", f"{DECIDE} 50\n", f"{LOOP} 20\n", "garbage line\n", "\n"]
    counts = rp.charge(raw)
    assert counts == {"upstream client": 30, "decide (engine)": 50, "event loop": 20}
    rows = rp.breakdown(counts, 100.0)
    assert [(r["part"], r["share"], r["us_per_request"]) for r in rows] == [
        ("decide (engine)", 0.5, 50.0), ("upstream client", 0.3, 30.0), ("event loop", 0.2, 20.0)]
    assert rp.breakdown(counts, None)[0]["us_per_request"] is None
    text = rp.table(rows)
    assert "decide (engine)" in text.splitlines()[2] and "50.0%" in text and text.rstrip().endswith("20.0")


def test_every_profile_target_is_one_bench_router_can_start() -> None:
    from bench import router

    assert set(rp.TARGETS) <= set(router.TARGETS)
    assert "kinference-null" in rp.TARGETS  # the transport alone, read against the router part by part


def _run(target: str, mode: str, parts: dict[str, float], cpu: float) -> dict:
    total = sum(parts.values())
    return {"target": target, "mode": mode, "rps": 1000.0, "requests": 10_000, "samples": 100,
            "cpu_us_per_request": cpu, "started": "2026-12-06T23:00:00Z",
            "parts": [{"part": p, "samples": 0, "share": v / total, "us_per_request": v} for p, v in parts.items()]}


def test_the_page_reads_the_router_against_its_transport_in_the_same_mode(tmp_path) -> None:
    router_run = _run("kinference", "plain", {"upstream client": 36.0, "decide (engine)": 4.0}, 40.0)
    alone = _run("kinference-null", "plain", {"upstream client": 14.0, rp.OTHER: 1.0}, 15.0)
    stream_alone = _run("kinference-null", "stream", {"HTTP server": 12.0}, 12.0)
    results = {rp.key(r): r for r in (router_run, alone, stream_alone)}
    block = rp.page_block(results)
    rows = [line for line in block.splitlines() if line.startswith("| ")]
    # the router's part beside the transport alone's; a part only the transport has, at the end
    assert "| upstream client | 90.0% | 36.0 | 14.0 |" in rows
    assert "| decide (engine) | 10.0% | 4.0 | - |" in rows
    assert f"| {rp.OTHER} | - | - | 1.0 |" in rows
    # the plain transport alone is a column, not a table of its own; the streamed one, with no router run, is
    assert block.count("`kinference-null`, plain") == 0 and "`kinference-null`, stream" in block
    assert "| HTTP server | 100.0% | 12.0 |" in rows

    page = tmp_path / "benchmarks.md"
    page.write_text("before\n<!-- router:profile -->\nstale\n<!-- /router:profile -->\nafter\n")
    assert rp.rewrite_page(page, results)
    text = page.read_text()
    assert "stale" not in text and text.startswith("before\n") and text.endswith("after\n")
    assert "| upstream client | 90.0% | 36.0 | 14.0 |" in text
    blockless = tmp_path / "none.md"
    blockless.write_text("no block\n")
    assert not rp.rewrite_page(blockless, results) and blockless.read_text() == "no block\n"


def test_results_keep_one_run_per_target_and_mode_and_read_the_old_one_run_file(tmp_path, monkeypatch) -> None:
    results = tmp_path / "router_profile.json"
    monkeypatch.setattr(rp, "RESULTS", results)
    old = _run("kinference-null", "plain", {"upstream client": 14.0}, 14.0)
    results.write_text(json.dumps(old))
    assert rp.load_results() == {"kinference-null/plain": old}
    results.write_text("not json")
    assert rp.load_results() == {}
    results.write_text('{"kinference/plain": {"target": "kinference"}, "x": 3}')  # entries without parts left out
    assert rp.load_results() == {}
