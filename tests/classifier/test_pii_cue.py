"""A phone cue followed by a number libphonenumber rejects is unknown, never none."""

from __future__ import annotations

import pytest

from kinference_classifier.core import Classifiers


@pytest.fixture(scope="module")
def classifiers() -> Classifiers:
    return Classifiers()


@pytest.mark.parametrize("text", ["Phone: 00470254690", "Call me at 00264263358 tomorrow", "mobile 0004057680"])
def test_rejected_number_after_a_cue_is_unknown(classifiers: Classifiers, text: str) -> None:
    assert classifiers.classify("pii", [text]).tags == ["pii-unknown"]


@pytest.mark.parametrize("text", ["Phone: 123", "call me at noon", "build 0004057680 passed"])
def test_short_numbers_and_no_cue_stay_clean(classifiers: Classifiers, text: str) -> None:
    assert classifiers.classify("pii", [text]).tags == ["pii-none"]
