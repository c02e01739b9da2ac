"""Exponential backoff with jitter: the n-th wait is drawn from
[c/2, c] with c = min(cap, base * 2^n), so clients that failed together do
not come back together."""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class Backoff:
    base: float = 0.2
    cap: float = 30.0
    rng: random.Random = field(default_factory=random.Random)
    attempts: int = 0

    def next(self) -> float:
        ceiling = min(self.cap, self.base * (2 ** self.attempts))
        self.attempts = min(self.attempts + 1, 30)
        return self.rng.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        self.attempts = 0
