"""bench.routing.band: the headline's cases over draws of the scrape instants
(``make bench-routing-band``). The simulator's ``phase`` moves only when
pods are scraped; the summary counts the goal per draw."""

from __future__ import annotations

import pytest

from bench.harness import save_results
from bench.routing import band, run
from bench.routing.fleet import fleet, simulate
from bench.routing.peers import LeastQueue
from bench.routing.workloads import generate


class _Spy(LeastQueue):
    """Least queue (it reads every scrape), keeping when each state arrived."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, float]] = []

    def on_telemetry(self, state, now: float) -> None:  # noqa: ANN001
        self.seen.append((state.pod, round(now, 9)))
        super().on_telemetry(state, now)


def _run(phase: int | None) -> tuple[_Spy, list[tuple]]:
    reqs = generate("shared_prefix", 2, 20.0, 3.0)
    spy = _Spy()
    kw = {} if phase is None else {"phase": phase}
    res = simulate(reqs, fleet(3, blocks=2048), [spy], seed=2, **kw)
    return spy, [(o.req.id, o.req.time) for o in res.outcomes]


def test_draw_0_is_the_benchmarks_and_another_draw_moves_only_the_scrapes() -> None:
    default, arrivals = _run(None)
    zero, arrivals0 = _run(0)
    other, arrivals1 = _run(1)
    assert zero.seen == default.seen and arrivals0 == arrivals
    # the same requests at the same instants, each pod scraped every interval ...
    assert arrivals1 == arrivals
    for seen in (default.seen, other.seen):
        for pod in {k for k, _ in seen}:
            times = [t for k, t in seen if k == pod and t > 0]
            assert len(times) > 20
            assert all(b - a == pytest.approx(0.1) for a, b in zip(times, times[1:]))
    # ... at other instants within the interval
    first = {}
    for key, t in default.seen:
        if t > 0:
            first.setdefault(key, t)
    first1 = {}
    for key, t in other.seen:
        if t > 0:
            first1.setdefault(key, t)
    assert first.keys() == first1.keys()
    assert first != first1
    assert all(0 < t <= 0.1 + 0.02 + 1e-9 for t in first1.values())


def _row(workload: str, router: str, load: float, p99: float, *, phase: int = 0, p50: float = 0.02,
         idle: float = 0.01, loaded: float = 0.01) -> dict:
    row = {"workload": workload, "router": router, "load": load, "replicas": 1, "scrape_interval_s": 0.1,
           "ttft_p50_s": p50, "ttft_p90_s": p50, "ttft_p99_s": p99, "goodput": 10.0,
           "idle_floor_p99_s": idle, "loaded_floor_p99_s": loaded, "seed": 1}
    if phase:
        row["phase"] = phase
    return row


def _rows() -> list[dict]:
    rows = []
    # shared_prefix: Kinference 0.050 on draw 0 (the lowest), 0.060 and 0.055 after; the peer 0.080 on
    # every draw, so the goal (0.7 x 0.080 = 0.056) is met on draws 0 and 2 only
    for phase, k in enumerate((0.050, 0.060, 0.055)):
        rows += [_row("shared_prefix", "kinference", 0.8, k, phase=phase),
                 _row("shared_prefix", "gie_default", 0.8, 0.080, phase=phase)]
    # multiturn: Kinference behind the peer on every draw; draw 0 its highest
    for phase, (k, peer) in enumerate(((0.110, 0.100), (0.105, 0.095), (0.100, 0.090))):
        rows += [_row("multiturn", "kinference", 0.8, k, phase=phase),
                 _row("multiturn", "round_robin", 0.8, peer, phase=phase)]
    return rows


def test_the_goal_is_judged_on_each_draw_and_draw_0_is_ranked() -> None:
    summary = band.summarize(_rows())
    sp, mt = summary
    assert (sp["workload"], mt["workload"]) == ("shared_prefix", "multiturn")
    assert sp["phases"] == [0, 1, 2]
    assert sp["met"] == [True, False, True]
    assert sp["goal_p99_s"] == pytest.approx([0.056] * 3)
    assert sp["draw0_rank"] == 1
    assert mt["met"] == [False, False, False]
    assert mt["draw0_rank"] == 3
    assert mt["p99_ratio"] == pytest.approx([1.1, 105 / 95, 100 / 90])
    t = band.totals(summary)
    assert t == {"cases": 2, "met_every_draw": 0, "met_no_draw": 1, "met_some_draws": 1, "draws": 6,
                 "draws_met": 2, "moving": 2, "draw0_lowest": 1, "draw0_highest": 1}
    page = band.markdown(summary, 1)
    assert "| shared_prefix | 0.8 | 0.050 | 0.055 (0.050-0.060) | 0.080 (0.080-0.080) (gie_default) |" in page
    assert "| met | 2 of 3 | lowest |" in page
    assert "| multiturn | 0.8 | 0.110 |" in page and "| missed | 0 of 3 | highest |" in page


def test_draws_with_the_same_p99_share_a_place() -> None:
    rows = []
    for phase, k in enumerate((0.050, 0.050, 0.060, 0.040)):
        rows += [_row("trial", "kinference", 0.8, k, phase=phase), _row("trial", "gie_default", 0.8, 1.0, phase=phase)]
    for phase in range(4):
        rows += [_row("chat", "kinference", 0.8, 0.5, phase=phase), _row("chat", "round_robin", 0.8, 0.6, phase=phase)]
    chat, trial = band.summarize(rows)
    assert (trial["draw0_rank"], trial["draw0_ties"]) == (2, 1)
    assert band._rank(trial) == "2 of 4 (with 1 more)"
    assert band._rank(chat) == "all the same"
    t = band.totals([chat, trial])
    # a case that does not move is neither draw 0's lowest nor its highest
    assert (t["moving"], t["draw0_lowest"], t["draw0_highest"]) == (1, 0, 0)


def test_the_headline_reads_draw_0_only() -> None:
    rows = _rows()
    heads = run.headline(rows, ("shared_prefix", "multiturn"), (0.8,))
    assert [h["kinference_p99_s"] for h in heads] == [0.050, 0.110]
    assert heads == run.headline([r for r in rows if not r.get("phase")], ("shared_prefix", "multiturn"), (0.8,))


def test_bad_arguments_are_refused_before_anything_runs(tmp_path, capsys) -> None:  # noqa: ANN001
    with pytest.raises(SystemExit):
        band.main(["--routers", "kinference"])
    assert "at least one peer" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        band.main(["--workloads", "nope"])
    assert "unknown workload 'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        band.main(["--phases", "0"])
    assert "--phases must be at least 1" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="no results"):
        band.main(["--page-only", "--out", str(tmp_path / "none.json")])


def test_a_run_writes_its_rows_and_its_block_only(tmp_path, capsys) -> None:  # noqa: ANN001
    page = tmp_path / "page.md"
    page.write_text("before\n<!-- routing:band -->\nold\n<!-- /routing:band -->\nafter\n")
    rows = _rows()
    save_results(tmp_path / "out" / "band.json", rows, 0.0, page, band.BLOCK, band.markdown(band.summarize(rows), 1))
    assert (tmp_path / "out" / "band.json").read_text().count('"workload"') == len(rows)
    text = page.read_text()
    assert text.startswith("before\n<!-- routing:band -->\nWritten by `make bench-routing-band`")
    assert "old" not in text and text.endswith("<!-- /routing:band -->\nafter\n")
    assert "rewrote the routing:band block" in capsys.readouterr().out
    save_results(tmp_path / "again.json", rows, 0.0, None, band.BLOCK, "ignored")
    assert "ignored" not in page.read_text()
