"""``/debug/explain``'s classification.

Without ``tags`` in the explain body, the request is classified as the data
port would classify it: every classifier the applicable rules need, asked in
parallel with its deadline, a failed or late one giving its failure tag. The
trace then shows what this request would really get (before, a PII prompt
was explained as if no classifier had run, so its PII exclusion showed
``applies: false``). With ``tags`` the caller's tags stand for the answers
and nothing is asked. Nothing is counted in the router's metrics: an explain
is not traffic.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from kinference_common.classifiers import BUILTIN_CLASSIFIERS
from kinference_common.classify_client import classify_body
from kinference_common.engine.trace import ClassifierTrace


async def classify_for_explain(nc: Any, names: Sequence[str],
                               body: dict[str, Any]) -> tuple[frozenset[str], list[ClassifierTrace]]:
    """The tags the classifiers give ``body`` and one trace entry per classifier."""

    async def one(name: str) -> tuple[str, Any, float]:
        started = time.perf_counter()
        reply = await classify_body(nc, name, body, BUILTIN_CLASSIFIERS[name].deadline_seconds,
                                    request_id="explain")
        return name, reply, time.perf_counter() - started

    results = await asyncio.gather(*(one(n) for n in names))
    tags: set[str] = set()
    traces = []
    for name, reply, seconds in results:
        tags.update(reply.tags)
        traces.append(ClassifierTrace(name=name, ms=round(seconds * 1e3, 3), outcome=reply.outcome))
    return frozenset(tags), traces
