"""``make profile-router``'s accounting of py-spy's samples (py-spy and the
router run only in the benchmark)."""

from __future__ import annotations

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
