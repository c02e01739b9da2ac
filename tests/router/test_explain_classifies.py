"""``/debug/explain`` without ``tags`` classifies the request as the data
port would. The trial explained a PII prompt on `make run` and got
``tags: []``, ``classifiers: []`` and the PII exclusion ``applies: false``:
the trace said the prompt could go to the provider, which the router itself
would never do."""

from __future__ import annotations

from typing import Any

from kinference_classifier.service import ClassifierService

from .test_router import CLEAN_PROMPT, PII_PROMPT, Env, classifier, env  # noqa: F401 (fixtures)


async def explain(env: Env, serve: Any, **body: Any) -> dict[str, Any]:
    admin = await serve(env.router.admin_server())
    try:
        r = await admin.post("/debug/explain", json={"model": "qwen-2.5", **body})
        assert r.status == 200, await r.text()
        return await r.json()
    finally:
        await admin.close()


def pii_exclusion(trace: dict[str, Any]) -> dict[str, Any]:
    rule = trace["rules"][0]
    return next(e for e in rule["excluded"] if e["exclusion"] == "ensure-pii-never-leaves-cluster")


async def test_a_pii_prompt_is_classified_and_its_exclusion_applies(env: Env, classifier: ClassifierService,
                                                                    serve: Any) -> None:
    trace = await explain(env, serve, messages=[{"role": "user", "content": PII_PROMPT}])
    assert "pii-confirmed" in trace["tags"]
    assert [(c["name"], c["outcome"]) for c in trace["classifiers"]] == [("pii", "ok")]
    assert pii_exclusion(trace)["applies"] is True


async def test_a_clean_prompt_is_classified_clean(env: Env, classifier: ClassifierService, serve: Any) -> None:
    trace = await explain(env, serve, messages=[{"role": "user", "content": CLEAN_PROMPT}])
    assert trace["tags"] == ["pii-none"]
    assert pii_exclusion(trace)["applies"] is False


async def test_given_tags_stand_for_the_answers_and_nothing_is_asked(env: Env, serve: Any) -> None:
    trace = await explain(env, serve, tags=["pii-none"], messages=[{"role": "user", "content": PII_PROMPT}])
    assert trace["tags"] == ["pii-none"] and trace["classifiers"] == []
    assert pii_exclusion(trace)["applies"] is False


async def test_without_a_classifier_service_the_failure_tag_is_explained(env: Env, serve: Any) -> None:
    """No classifier answers: fail closed, as the data port does."""
    trace = await explain(env, serve, messages=[{"role": "user", "content": CLEAN_PROMPT}])
    assert trace["tags"] == ["pii-unknown"]
    assert trace["classifiers"][0]["outcome"] != "ok"
    assert pii_exclusion(trace)["applies"] is True
