"""PredictedTTFT's online calibration factor (kinference_common.engine.ttft.Calibration)."""

from __future__ import annotations

import math

import pytest

from kinference_common.engine import Calibration


def test_one_until_enough_samples_then_the_observed_ratio() -> None:
    cal = Calibration(min_samples=20)
    for _ in range(19):
        cal.observe(0.2, 0.1)
    assert cal.value == 1.0
    cal.observe(0.2, 0.1)
    assert cal.value == pytest.approx(2.0)


def test_ratios_average_on_the_log_scale() -> None:
    cal = Calibration(min_samples=1)
    for _ in range(100):
        cal.observe(0.3, 0.1)  # 3x slower
        cal.observe(0.1, 0.3)  # 3x faster
    assert cal.value == pytest.approx(1.0, rel=0.2)  # an arithmetic mean would say ~1.67


def test_it_follows_a_change() -> None:
    cal = Calibration(min_samples=1, alpha=0.05)
    for _ in range(50):
        cal.observe(0.1, 0.1)
    for _ in range(200):
        cal.observe(0.15, 0.1)
    assert cal.value == pytest.approx(1.5, rel=0.02)


def test_one_stalled_request_cannot_swing_it_and_c_is_bounded() -> None:
    cal = Calibration(min_samples=1)
    for _ in range(30):
        cal.observe(0.1, 0.1)
    cal.observe(600.0, 0.1)  # one request stuck for ten minutes
    assert cal.value < 1.2
    for _ in range(500):
        cal.observe(100.0, 0.1)
    assert cal.value == pytest.approx(4.0)  # the bound


@pytest.mark.parametrize("observed, predicted", [(0.0, 0.1), (-1.0, 0.1), (0.1, 0.0), (0.1, math.inf),
                                                 (math.nan, 0.1), (0.1, math.nan)])
def test_meaningless_samples_are_ignored(observed: float, predicted: float) -> None:
    cal = Calibration(min_samples=1)
    cal.observe(observed, predicted)
    assert cal.samples == 0 and cal.value == 1.0
