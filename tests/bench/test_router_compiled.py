"""``make bench-router-compiled``'s list of modules and its summary (Cython
and the router run only in the benchmark)."""

from __future__ import annotations

from bench import router_compiled as rc


def test_every_module_compiled_is_a_module_of_the_router() -> None:
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
            _row("interpreted", "stream", 160, 6000)]
    (plain,) = rc.summarize(rows)  # stream has no compiled figure: no summary for it
    assert plain["mode"] == "plain"
    assert plain["interpreted_cpu_us_per_request"] == 140 and plain["compiled_cpu_us_per_request"] == 130
    assert plain["cpu_ratio"] == round(130 / 140, 3) and plain["rps_ratio"] == round(7500 / 7000, 3)
