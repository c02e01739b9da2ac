"""bench.routing.report: the page's result tables come from routing.json."""

from __future__ import annotations

from bench.routing import report


def _row(workload: str, router: str, load: float, p50: float, p99: float, **kw) -> dict:
    row = {"workload": workload, "router": router, "load": load, "replicas": 1, "scrape_interval_s": 0.1,
           "ttft_p50_s": p50, "ttft_p90_s": p50, "ttft_p99_s": p99, "e2e_p50_s": 1.0, "e2e_p99_s": 2.0,
           "output_tokens_per_s": 1.0, "goodput": 10.0, "prefix_hit_rate": 0.5, "preemptions": 0,
           "load_cv": 0.1, "idle_floor_p99_s": 0.5}
    row.update(kw)
    return row


ROWS = [
    _row("chat", "round_robin", 0.8, 0.26, 0.58), _row("chat", "kinference", 0.8, 0.25, 0.53),
    _row("shared_prefix", "gie_default", 0.8, 0.019, 0.049), _row("shared_prefix", "kinference", 0.8, 0.019, 0.052),
    _row("hetero", "gie_default", 1.0, 0.031, 3.0), _row("hetero", "kinference", 1.0, 0.034, 0.08),
]


def test_blocks_between_markers_are_replaced_and_prose_is_kept() -> None:
    page = ("intro stays\n<!-- routing:headline -->\nold table\n<!-- /routing:headline -->\nmiddle stays\n"
            "<!-- routing:nonsense -->\nkept\n<!-- /routing:nonsense -->\n")
    out, done, unknown = report.rewrite(page, ROWS)
    assert done == ["headline"] and unknown == ["nonsense"]
    assert "old table" not in out and "intro stays" in out and "middle stays" in out and "kept" in out
    assert "| chat | 0.8 | 0.530 s | round_robin (0.580 s) | x0.91 |" in out
    # 0.7 x 0.58 = 0.406 s is under chat's 0.5 s idle floor
    assert "0.406 s: under the idle floor" in out


def test_targets_lists_only_where_kinference_is_over_five_percent_behind() -> None:
    table = report.targets(ROWS)
    lines = table.splitlines()[2:]
    # shared_prefix p99 is 6% above gie_default's; hetero p50 is 10% above; chat is ahead
    assert [line.split(" | ")[0].strip("| ") for line in lines] == ["shared_prefix", "hetero"]
    assert "**0.052 / 0.049 (gie_default)**" in lines[0]
    assert "**0.034 / 0.031 (gie_default)**" in lines[1] and "**0.080" not in lines[1]


def test_check_fails_when_the_page_lost_a_block(tmp_path) -> None:  # noqa: ANN001
    import json

    results = tmp_path / "routing.json"
    results.write_text(json.dumps(ROWS))
    page = tmp_path / "page.md"
    page.write_text("<!-- routing:headline -->\n<!-- /routing:headline -->\n")
    assert report.main(["--results", str(results), "--page", str(page), "--check"]) == 1
    assert report.main(["--results", str(results), "--page", str(page)]) == 0
    assert "round_robin" in page.read_text()
