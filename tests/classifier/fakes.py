"""Stand-in detectors for the service tests."""

from __future__ import annotations

import time
from collections.abc import Sequence

from kinference_classifier.core import Budget, Detection, Verdict
from kinference_classifier.pii import TAGS as PII_TAGS
from kinference_common.classifiers import PII


class CountingDetector:
    """A PII detector that finds nothing, counts its runs, and takes ``delay`` seconds a run."""

    info = PII
    tags = PII_TAGS

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.ran = 0

    def detect(self, texts: Sequence[str], roles: Sequence[str], unreadable: int, budget: Budget) -> Detection:
        self.ran += 1
        if self.delay:
            time.sleep(self.delay)
        return Detection(Verdict.NONE)
