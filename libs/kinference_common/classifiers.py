"""The built-in classifiers: the one place their names, tags, deadlines and
failure behaviour are written down.

The policy compiler reads this to resolve tags to classifiers and to fill each
rule's ``requiresClassifiers``, ``worstCaseClassifierLatency``,
``classifierFailureMode`` and ``emittableTags``; the classifier service reads
it to know what it may emit; the router reads the deadlines and failure tags.

A tag's prefix (up to the first ``-``) names the classifier that emits it
(POLICY.md section 6). Classifiers are not configurable, so what is here is
reported in each policy's status rather than written in manifests.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

import msgspec


class ClassifierInfo(msgspec.Struct, frozen=True, kw_only=True):
    """What a built-in classifier is and how it fails."""

    name: str
    #: Every tag the classifier can emit; it emits exactly one per request.
    tags: tuple[str, ...]
    #: The tag emitted when the classifier errors, times out, or is absent.
    failure_tag: str
    #: How long the router waits for an answer before using ``failure_tag``.
    deadline_seconds: float
    description: str
    #: The deadline when the classifier runs in the router's own process
    #: (:data:`IN_PROCESS`): no network, so a tighter bound on the work.
    in_process_deadline_seconds: float = 0.005

    def deadline(self, path: str = "Service") -> float:
        """The deadline that applies on ``path`` (:data:`SERVICE` or :data:`IN_PROCESS`)."""
        return self.in_process_deadline_seconds if path == IN_PROCESS else self.deadline_seconds

    def failure_mode(self, path: str = "Service") -> str:
        """The effective behaviour on failure, as the policy status shows it,
        with the path (service over NATS, or in the router's process) and its deadline."""
        from kinference_common.durations import format_duration

        where = (
            "in the router's process, no prompt on the bus" if path == IN_PROCESS
            else f"classifier service over NATS, kinference.classify.{self.name}"
        )
        return (
            f"FailClosed: emits {self.failure_tag} on error, oversize input, "
            f"or no answer within {format_duration(self.deadline(path))} ({path}: {where})"
        )


#: Where a classifier runs: the classifier service over NATS (the default), or
#: inside the router's process (the policy-compiler's ``--in-process-classifier``).
SERVICE: Final = "Service"
IN_PROCESS: Final = "InProcess"
PATHS: Final = (SERVICE, IN_PROCESS)

PII: Final = ClassifierInfo(
    name="pii",
    tags=("pii-confirmed", "pii-unknown", "pii-none"),
    failure_tag="pii-unknown",
    deadline_seconds=0.020,
    description=(
        "Personal data and secrets: pii-confirmed for validated or unambiguous hits, "
        "pii-unknown for plausible but unvalidated ones or when it cannot tell, "
        "pii-none when clean."
    ),
)

INJECTION: Final = ClassifierInfo(
    name="injection",
    tags=("injection-detected", "injection-none", "injection-unknown"),
    failure_tag="injection-unknown",
    deadline_seconds=0.020,
    description="Known prompt-injection patterns.",
)

#: Inputs larger than this (characters, all texts together) are not classified:
#: the classifier answers its failure tag at once (fail closed, quickly).
DEFAULT_MAX_CHARS: Final = 256 * 1024

BUILTIN_CLASSIFIERS: Final[dict[str, ClassifierInfo]] = {c.name: c for c in (PII, INJECTION)}

#: tag -> classifier name, for every tag some classifier can emit.
TAG_TO_CLASSIFIER: Final[dict[str, str]] = {
    tag: c.name for c in BUILTIN_CLASSIFIERS.values() for tag in c.tags
}


def classifier_for_tag(tag: str) -> ClassifierInfo | None:
    """The classifier that emits ``tag``, or None when no classifier can."""
    name = TAG_TO_CLASSIFIER.get(tag)
    return BUILTIN_CLASSIFIERS[name] if name else None


def classifier_for_prefix(tag: str) -> ClassifierInfo | None:
    """The classifier a tag's prefix names, even if that tag is not one it emits."""
    return BUILTIN_CLASSIFIERS.get(tag.split("-", 1)[0])


def given_tags(tags: Iterable[str]) -> dict[str, str]:
    """Tags given by hand instead of asked for (``kinfctl explain --tag``,
    ``/debug/explain``'s ``tags``): classifier name -> its tag. ValueError
    naming the first tag no classifier emits (a typo would otherwise explain
    a request no classifier can tag so), or a second tag of one classifier."""
    given: dict[str, str] = {}
    for t in tags:
        info = classifier_for_prefix(t)
        if info is None or t not in info.tags:
            emits = (f"the {info.name} classifier emits {', '.join(sorted(info.tags))}" if info is not None else
                     "tags are " + "; ".join(", ".join(sorted(i.tags)) for i in BUILTIN_CLASSIFIERS.values()))
            raise ValueError(f"{t}: not a tag a classifier emits ({emits})")
        if info.name in given:  # a classifier gives a request one tag
            raise ValueError(f"{t}: {info.name} already gave {given[info.name]} (one tag per classifier)")
        given[info.name] = t
    return given
