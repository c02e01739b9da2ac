"""A classifier that raises, in process or on the service path, gives the
request its failure tag (the router never fails open, and never answers
500 for it)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from kinference_router.classification import Classification
from kinference_router.metrics import RouterMetrics

BODY = SimpleNamespace(raw={"model": "m", "messages": [{"role": "user", "content": "4111 1111 1111 1111"}]})


def snap(in_process: list[str]) -> Any:
    return SimpleNamespace(pool=SimpleNamespace(policy=SimpleNamespace(in_process_classifiers=in_process)))


class Raises:
    names = ["pii", "injection"]

    def classify(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("detector bug")


async def test_an_in_process_classifier_that_raises_gives_its_failure_tag() -> None:
    c = Classification(RouterMetrics())
    c._detectors = Raises()
    tags, traces = await c.ask(snap(["pii"]), ["pii"], BODY, "d1")
    assert tags == frozenset({"pii-unknown"})
    assert traces[0].outcome == "error"


async def test_a_service_path_that_raises_gives_its_failure_tag() -> None:
    c = Classification(RouterMetrics())

    class Broken:
        async def classify(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("client bug")

    c.batcher = Broken()  # type: ignore[assignment]
    tags, traces = await c.ask(snap([]), ["pii"], BODY, "d2")
    assert tags == frozenset({"pii-unknown"})
    assert traces[0].outcome == "error"
    assert c.pressure["pii"].in_flight == 0
