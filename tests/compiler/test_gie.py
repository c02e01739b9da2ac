"""InferenceObjective and InferenceModelRewrite (seed 003, RESOURCES.md)."""

from __future__ import annotations

from .conftest import FLEET, compile_text

POOL = ("apiVersion: kinference.buoyant.io/v1alpha1\nkind: InferencePool\nmetadata: {name: pool}\n"
        "spec: {destinations: [{kind: InferenceWorkerSet, name: gemma-4-12b}]}\n")


def rewrite(name: str, rules: str, group: str = "inference.networking.x-k8s.io", created: str = "",
            pool_group: str = "kinference.buoyant.io") -> str:
    ts = f", creationTimestamp: '{created}'" if created else ""
    return (f"apiVersion: {group}/v1alpha2\nkind: InferenceModelRewrite\nmetadata: {{name: {name}{ts}}}\n"
            f"spec:\n  poolRef: {{group: {pool_group}, name: pool}}\n  rules:\n{rules}\n")


def test_rewrite_precedence_exact_before_generic_then_oldest() -> None:
    newer = rewrite("newer", "    - matches: [{model: {value: qwen-2.5}}]\n      targets: [{modelRewrite: gemma-4}]",
                    created="2026-02-01T00:00:00Z")
    older = rewrite("older", "    - targets: [{modelRewrite: gemma-4}]\n"
                             "    - matches: [{model: {value: qwen-2.5}}]\n"
                             "      targets: [{modelRewrite: gemma-4, weight: 3}, {modelRewrite: qwen-2.5, weight: 1}]",
                    created="2026-01-01T00:00:00Z")
    res = compile_text(FLEET, POOL, newer, older)
    rw = res.pools[("default", "pool")].rewrites
    assert [(x.source.split()[1], x.match_model) for x in rw] == [
        ("default/older", "qwen-2.5"), ("default/newer", "qwen-2.5"), ("default/older", None)]
    assert [(t.model, t.weight) for t in rw[0].targets] == [("gemma-4", 3), ("qwen-2.5", 1)]


def test_mixed_weights_are_invalid_and_never_half_applied() -> None:
    bad = rewrite("bad", "    - matches: [{model: {value: a}}]\n      targets: [{modelRewrite: b}]\n"
                         "    - matches: [{model: {value: c}}]\n      targets: [{modelRewrite: d, weight: 1}, {modelRewrite: e}]")
    res = compile_text(FLEET, POOL, bad)
    [cond] = res.rewrite_status[("inference.networking.x-k8s.io", "default", "bad")].conditions
    assert (cond.status, cond.reason) == ("False", "InvalidWeights")
    assert res.pools[("default", "pool")].rewrites == []


def test_llm_d_group_wins_and_foreign_pools_are_left_alone() -> None:
    a = rewrite("r", "    - targets: [{modelRewrite: x}]")
    b = rewrite("r", "    - targets: [{modelRewrite: y}]", group="llm-d.ai")
    foreign = rewrite("f", "    - targets: [{modelRewrite: z}]", pool_group="inference.networking.k8s.io")
    res = compile_text(FLEET, POOL, a, b, foreign)
    assert [t.model for t in res.pools[("default", "pool")].rewrites[0].targets] == ["y"]
    assert res.rewrite_status[("inference.networking.x-k8s.io", "default", "r")].conditions[0].reason == "Superseded"
    assert ("inference.networking.x-k8s.io", "default", "f") not in res.rewrite_status


def test_objectives_priority_and_missing_pool() -> None:
    obj = ("apiVersion: inference.networking.x-k8s.io/v1alpha2\nkind: InferenceObjective\n"
           "metadata: {name: critical}\nspec: {priority: 10, poolRef: {group: kinference.buoyant.io, name: pool}}\n"
           "---\napiVersion: llm-d.ai/v1alpha2\nkind: InferenceObjective\n"
           "metadata: {name: batch}\nspec: {poolRef: {group: kinference.buoyant.io, name: pool}}\n"
           "---\napiVersion: llm-d.ai/v1alpha2\nkind: InferenceObjective\n"
           "metadata: {name: lost}\nspec: {priority: -1, poolRef: {group: kinference.buoyant.io, name: nope}}\n")
    res = compile_text(FLEET, POOL, obj)
    assert res.pools[("default", "pool")].objectives == {"critical": 10, "batch": 0}
    cond = res.objective_status[("llm-d.ai", "default", "lost")].conditions[0]
    assert (cond.status, cond.reason) == ("False", "PoolNotFound")
