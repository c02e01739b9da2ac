"""Failing closed in-process: size cap, errors, deadline."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from kinference_classifier.core import (
    Budget,
    Classifiers,
    Detection,
    Verdict,
)
from kinference_classifier.pii import TAGS as PII_TAGS
from kinference_common.classifiers import BUILTIN_CLASSIFIERS, PII


class Spy:
    """A pii detector that records calls and does what it is told."""

    info = PII
    tags = PII_TAGS

    def __init__(self, action: str = "none") -> None:
        self.action = action
        self.calls = 0

    def detect(
        self, texts: Sequence[str], roles: Sequence[str], unreadable: int, budget: Budget
    ) -> Detection:
        self.calls += 1
        if self.action == "raise":
            raise ValueError("secret text 4111 1111 1111 1111")
        if self.action == "slow":
            while True:  # a detector that would run forever, checking its budget
                budget.check()
        return Detection(Verdict.NONE)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        self.now += 0.001  # every reading advances 1 ms
        return self.now


def test_oversize_input_is_failure_tag_without_reading_it() -> None:
    spy = Spy()
    c = Classifiers(detectors=[spy], max_chars=1000)
    reply = c.classify("pii", ["x" * 600, "y" * 600])
    assert reply.tags == ["pii-unknown"]
    assert reply.outcome == "oversize"
    assert spy.calls == 0


def test_default_cap_on_a_huge_input() -> None:
    c = Classifiers()
    reply = c.classify("pii", ["a" * (c.max_chars + 1)])
    assert (reply.tags, reply.outcome) == (["pii-unknown"], "oversize")
    reply = c.classify("injection", ["a" * (c.max_chars + 1)])
    assert (reply.tags, reply.outcome) == (["injection-unknown"], "oversize")


def test_detector_error_is_failure_tag_and_hides_the_message() -> None:
    c = Classifiers(detectors=[Spy("raise")])
    reply = c.classify("pii", ["hello"])
    assert reply.tags == ["pii-unknown"]
    assert reply.outcome == "error"
    assert reply.detail == "ValueError"
    assert "4111" not in repr(reply)


def test_deadline_is_failure_tag() -> None:
    c = Classifiers(detectors=[Spy("slow")], clock=FakeClock())
    reply = c.classify("pii", ["hello"], deadline_ms=5)
    assert reply.tags == ["pii-unknown"]
    assert reply.outcome == "deadline"


def test_no_deadline_means_the_detector_finishes() -> None:
    c = Classifiers(detectors=[Spy()], clock=FakeClock())
    assert c.classify("pii", ["hello"], deadline_ms=None).tags == ["pii-none"]


def test_unknown_classifier_is_an_error_reply() -> None:
    reply = Classifiers().classify("nope", ["x"])
    assert reply.outcome == "error" and reply.tags == []


def test_builtin_classifier_not_loaded_is_its_failure_tag() -> None:
    reply = Classifiers(detectors=[Spy()]).classify("injection", ["x"])
    assert (reply.tags, reply.outcome) == (["injection-unknown"], "error")


def test_expired_deadline_is_failure_tag() -> None:
    c = Classifiers(detectors=[Spy("slow")], clock=FakeClock())
    assert c.classify("pii", ["hello"], deadline_ms=-1).outcome == "deadline"


@pytest.mark.parametrize("name", sorted(BUILTIN_CLASSIFIERS))
def test_failure_tags_come_from_shared_metadata(name: str) -> None:
    c = Classifiers(max_chars=1)
    assert c.classify(name, ["xx"]).tags == [BUILTIN_CLASSIFIERS[name].failure_tag]
    detector = c.detectors[name]
    assert set(detector.tags.values()) == set(BUILTIN_CLASSIFIERS[name].tags)
