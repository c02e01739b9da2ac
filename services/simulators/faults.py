"""Failure injection: one seeded draw per request decides its fate."""

from __future__ import annotations

import random
from collections.abc import Mapping


class Faults:
    """Outcomes with probabilities; :meth:`draw` returns one of them or None (serve normally)."""

    def __init__(self, rng: random.Random, rates: Mapping[str, float]) -> None:
        for name, p in rates.items():
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"rate of {name} must be within 0..1, got {p}")
        if sum(rates.values()) > 1.0 + 1e-9:
            raise ValueError("failure rates add up to more than 1")
        self._rng = rng
        self._rates = [(name, p) for name, p in rates.items() if p > 0]

    def draw(self) -> str | None:
        if not self._rates:
            return None
        x = self._rng.random()
        acc = 0.0
        for name, p in self._rates:
            acc += p
            if x < acc:
                return name
        return None
