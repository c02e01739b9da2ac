"""A few seconds of ``python -m bench.routing.scaleup``: the late pod takes
nothing before it joins, under every router, and the rows say when it took
its first request. Asserts behaviour, never timings."""

from __future__ import annotations

import dataclasses
import functools

import pytest

from bench.routing import run, scaleup
from bench.routing.fleet import fleet

SMOKE = run.WorkloadSpec("shared_prefix", lambda: fleet(4, blocks=2048), duration=8.0, ttft_slo=0.5, warmup=1.0)


@pytest.mark.parametrize("router", ["round_robin", "kinference"])
def test_the_late_pod_takes_nothing_before_it_joins(router: str) -> None:
    row = scaleup.measure("shared_prefix", router, 0.8, 4.0, 3, spec=SMOKE)
    assert row["sent_before_join"] == 0
    assert row["pods"] == 4 and row["fair_share"] == 0.25
    assert row["ttft_p50_s"] <= row["ttft_p99_s"]
    if router == "round_robin":  # round robin gives it its turn at once
        assert row["first_request_after_s"] is not None and row["first_request_after_s"] < 0.5
        assert 0.15 < row["share_next_8s"] < 0.35


#: the benchmark's own fleet (8 pods) for 16 s: the holders are busy enough for the spread
BUSY = dataclasses.replace(run.SPECS["shared_prefix"], duration=16.0, warmup=2.0)


def test_kinference_gives_a_pod_that_joined_empty_work(monkeypatch: pytest.MonkeyPatch) -> None:
    # every group has a warm holder when the pod joins at 10 s: the spread
    # (TTFTModel.spread_fraction) moves groups to it
    row = scaleup.measure("shared_prefix", "kinference", 1.0, 10.0, 1, spec=BUSY)
    assert row["first_request_after_s"] is not None and row["first_request_after_s"] < 1.0
    assert row["share_next_8s"] > 0.02
    # without the spread it never got one (what the benchmark page first found)
    from bench.routing import kinference

    monkeypatch.setattr(kinference, "TTFTModel", functools.partial(kinference.TTFTModel, spread_fraction=0.0))
    row = scaleup.measure("shared_prefix", "kinference", 1.0, 10.0, 1, spec=BUSY)
    assert row["first_request_after_s"] is None and row["share_next_8s"] == 0.0


def test_without_the_join_round_robin_would_send_it_work_from_the_start() -> None:
    # the measurement can fail: a join at 0 s leaves the pod its share before 4 s
    row = scaleup.measure("shared_prefix", "round_robin", 0.8, 0.0, 3, spec=SMOKE)
    assert row["first_request_after_s"] is not None and row["first_request_after_s"] < 0.5
    assert row["share_first_2s"] > 0.15


def test_the_table_names_a_pod_that_never_took_a_request() -> None:
    rows = [{"workload": "w", "load": 0.8, "router": "r", "first_request_after_s": None, "share_first_2s": 0.0,
             "share_next_8s": 0.0, "fair_share": 0.25, "ttft_p50_after_s": 0.02, "ttft_p99_after_s": 0.05,
             "ttft_p50_s": 0.02, "ttft_p99_s": 0.05}]
    assert "| never |" in scaleup.table(rows)


def test_an_unknown_workload_or_router_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        scaleup.main(["--workloads", "nope", "--routers", "kinference"])
    assert e.value.code == 2
    assert "unknown workload or router: nope" in capsys.readouterr().err
