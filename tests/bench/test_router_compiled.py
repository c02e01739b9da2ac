"""``make bench-router-compiled``'s list of modules and its summary (Cython
and the router run only in the benchmark)."""

from __future__ import annotations

from bench import router_compiled as rc


def test_every_module_compiled_is_a_module_of_the_router() -> None:
    assert set(rc.MYPYC_MODULES) <= set(rc.MODULES)
    for module in rc.MODULES:
        package, _, rest = module.partition("/")
        assert (rc.SOURCES[package] / rest).is_file(), module
    # the request path's heaviest parts are in the list (a rename must not drop them silently)
    for needed in ("kinference_router/app.py", "kinference_router/http_server.py",
                   "kinference_common/upstream_http.py", "kinference_common/engine/decide.py"):
        assert needed in rc.MODULES


def _row(variant: str, mode: str, cpu: float, rps: float) -> dict:
    return {"variant": variant, "mode": mode, "cpu_us_per_request": cpu, "rps": rps}


def test_summary_is_the_median_of_each_variant_and_their_ratio() -> None:
    rows = [_row("interpreted", "plain", 140, 7000), _row("interpreted", "plain", 150, 6800),
            _row("interpreted", "plain", 100, 9000), _row("compiled", "plain", 126, 7700),
            _row("compiled", "plain", 130, 7500), _row("compiled", "plain", 400, 100),
            {"variant": "compiled", "mode": "stream", "error": "could not start"},
            {"variant": "compiled", "mode": "plain", "rps": 1.0},  # no CPU figure (/proc unreadable): left out
            _row("interpreted", "stream", 160, 6000)]
    (plain,) = rc.summarize(rows)  # stream has no compiled figure: no summary for it
    assert plain["mode"] == "plain" and plain["target"] == "kinference"
    assert plain["interpreted_cpu_us_per_request"] == 140 and plain["compiled_cpu_us_per_request"] == 130
    assert plain["cpu_ratio"] == round(130 / 140, 3) and plain["rps_ratio"] == round(7500 / 7000, 3)


def test_each_target_is_summarized_apart() -> None:
    rows = [{**_row("interpreted", "plain", 140, 7000), "target": "kinference"},
            {**_row("compiled", "plain", 130, 7500), "target": "kinference"},
            {**_row("interpreted", "plain", 35, 29000), "target": "kinference-null"},
            {**_row("compiled", "plain", 28, 36000), "target": "kinference-null"}]
    got = {s["target"]: s for s in rc.summarize(rows)}
    assert got["kinference"]["cpu_ratio"] == round(130 / 140, 3)
    assert got["kinference-null"]["cpu_ratio"] == 0.8 and got["kinference-null"]["interpreted_rps"] == 29000


def test_the_page_block_is_written_from_the_results(tmp_path) -> None:
    summary = [{"target": "kinference-null", "mode": "plain", "interpreted_cpu_us_per_request": 33.7,
                "compiled_cpu_us_per_request": 27.2, "cpu_ratio": 0.807, "rps_ratio": 1.245,
                "interpreted_rps": 1.0, "compiled_rps": 1.0}]
    results = {"mypyc": {"modules": list(rc.MYPYC_MODULES), "rounds": 2, "started": "2026-12-06T22:24:35Z",
                         "summary": summary}}
    page = tmp_path / "page.md"
    page.write_text("before\n<!-- router:compiled -->\nold\n<!-- /router:compiled -->\nafter\n")
    assert rc.rewrite_page(page, results)
    text = page.read_text()
    assert "old" not in text and text.startswith("before\n") and text.endswith("after\n")
    assert "| mypyc | 2 | kinference-null | plain | 33.7 | 27.2 | 0.81x | 1.25x | 2026-12-06 22:24:35 UTC, median of 2 |" in text
    page.write_text("no block here\n")
    assert not rc.rewrite_page(page, results)


def test_results_file_of_another_shape_reads_as_empty(tmp_path, monkeypatch) -> None:
    path = tmp_path / "router_compiled.json"
    monkeypatch.setattr(rc, "RESULTS", path)
    assert rc.load_results() == {}  # missing
    path.write_text('{"compiler": "cython", "rows": []}')  # one run, not one entry per compiler
    assert rc.load_results() == {}
    path.write_text("not json")
    assert rc.load_results() == {}
    path.write_text('{"mypyc": {"summary": []}, "other": {}}')
    assert rc.load_results() == {"mypyc": {"summary": []}}
