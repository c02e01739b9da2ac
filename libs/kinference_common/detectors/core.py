"""The in-process classifier API shared by the service, ``kinfctl classify`` and the benches.

:class:`Classifiers` holds one compiled detector per built-in classifier and
answers :meth:`Classifiers.classify` with a :class:`ClassifyReply`, the same
message the NATS service sends, so callers cannot tell the paths apart.

Failing closed lives here, once, for every classifier: input over the size
cap, an exception in a detector, or running past the caller's deadline all
answer the classifier's ``failure_tag`` (from
:mod:`kinference_common.classifiers`) with ``outcome`` saying why. The size
check is the first thing done and costs one ``len`` per text, so an
oversize input is answered without reading it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Protocol

from kinference_common.classifiers import BUILTIN_CLASSIFIERS, DEFAULT_MAX_CHARS, ClassifierInfo
from kinference_common.messages import ClassifyReply

#: Characters (summed over texts) above which a request is answered with the
#: failure tag without being read: about 32k tokens of prose. The deadline is
#: what really bounds work; the cap makes the answer for a huge prompt instant.


class Verdict(IntEnum):
    """Ordered: a request's verdict is the strongest over all candidates."""

    NONE = 0
    UNKNOWN = 1
    POSITIVE = 2  # pii-confirmed, injection-detected


class DeadlineExceeded(Exception):
    """Raised by :meth:`Budget.check` when the caller's deadline has passed."""


@dataclass(slots=True)
class Budget:
    """The time a detector may spend; detectors call :meth:`check` between steps."""

    clock: Callable[[], float]
    until: float | None

    def check(self) -> None:
        if self.until is not None and self.clock() > self.until:
            raise DeadlineExceeded


@dataclass(slots=True)
class Detection:
    verdict: Verdict
    #: entity kinds behind the verdict (never any text of the prompt)
    findings: list[str] = field(default_factory=list)


class Detector(Protocol):
    """A pure function of the request's texts (no I/O, no state between calls)."""

    info: ClassifierInfo
    #: verdict -> tag; every value is one of ``info.tags``
    tags: dict[Verdict, str]

    def detect(
        self, texts: Sequence[str], roles: Sequence[str], unreadable: int, budget: Budget
    ) -> Detection: ...


def check_tags(info: ClassifierInfo, tags: dict[Verdict, str]) -> dict[Verdict, str]:
    """Fail at import if a detector's tags drift from the shared metadata."""
    if set(tags.values()) != set(info.tags) or len(tags) != len(Verdict):
        raise RuntimeError(f"{info.name}: tags {tags} do not match {info.tags}")
    return tags


class Classifiers:
    """Every built-in detector, compiled once; ``classify`` is the whole API."""

    def __init__(
        self,
        *,
        engine: str | None = None,
        max_chars: int = DEFAULT_MAX_CHARS,
        clock: Callable[[], float] = time.perf_counter,
        detectors: Sequence[Detector] | None = None,
    ) -> None:
        if detectors is None:
            from kinference_common.detectors.injection import InjectionDetector
            from kinference_common.detectors.pii import PiiDetector

            detectors = (PiiDetector(engine=engine), InjectionDetector(engine=engine))
        self.detectors: dict[str, Detector] = {d.info.name: d for d in detectors}
        self.max_chars = max_chars
        self.clock = clock
        self.engine = engine

    def warm_up(self) -> None:
        """Load lazily built tables (libphonenumber's regions) before the first request."""
        sample = (
            "call +44 20 7946 0958 or (415) 555-2671 or 030 1234 5678, "
            "mail a@example.org, card 4111 1111 1111 1111, ip 8.8.8.8"
        )
        for name, detector in self.detectors.items():
            warm = getattr(detector, "warm_up", None)
            if warm is not None:
                warm()
            self.classify(name, [sample])

    @property
    def names(self) -> list[str]:
        return list(self.detectors)

    def classify(
        self,
        classifier: str,
        texts: Sequence[str],
        *,
        roles: Sequence[str] = (),
        unreadable: int = 0,
        deadline_ms: float | None = None,
        request_id: str = "",
    ) -> ClassifyReply:
        """Exactly one tag of ``classifier``; never raises for bad input."""
        t0 = self.clock()
        detector = self.detectors.get(classifier)
        info = detector.info if detector else BUILTIN_CLASSIFIERS.get(classifier)
        if info is None:
            return ClassifyReply(
                classifier=classifier,
                tags=[],
                outcome="error",
                request_id=request_id,
                detail="unknown classifier",
            )

        def reply(
            tag: str, outcome: str, findings: list[str] | None = None, detail: str = ""
        ) -> ClassifyReply:
            return ClassifyReply(
                classifier=classifier,
                tags=[tag],
                outcome=outcome,  # type: ignore[arg-type]
                micros=round((self.clock() - t0) * 1e6, 1),
                request_id=request_id,
                findings=findings or [],
                detail=detail,
            )

        if detector is None:  # built in, but not loaded here
            return reply(info.failure_tag, "error", detail="classifier not loaded")
        total = 0
        for t in texts:
            total += len(t)
        if total > self.max_chars:
            return reply(info.failure_tag, "oversize", detail=f"{total} chars > {self.max_chars}")
        if deadline_ms is not None and not deadline_ms > 0:  # no time at all (or nonsense)
            return reply(info.failure_tag, "deadline", detail="no time left")
        until = None if deadline_ms is None else t0 + deadline_ms / 1000.0
        try:
            found = detector.detect(texts, roles, unreadable, Budget(self.clock, until))
        except DeadlineExceeded:
            return reply(info.failure_tag, "deadline")
        except Exception as exc:  # the message may quote the prompt: keep only the type
            return reply(info.failure_tag, "error", detail=type(exc).__name__)
        return reply(detector.tags[found.verdict], "ok", found.findings)
