"""Every example manifest of the seeds lints clean: no errors and no warnings,
beyond the guide's list-shaped policyRef (accepted, with a warning)."""

from __future__ import annotations

import pytest

from .conftest import FLEET, SEED_DIR, compile_text

EXAMPLES = {
    # example file -> pools needed so that its policy is referenced and its
    # destination names resolve (the seeds name worker sets they never define)
    "000-burst-policy.yaml": "inference-all",
    "001-guide-alice.yaml": None,
    "001-guide-policy-3.yaml": "inference-all",
}


@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_seed_policy_examples_lint_clean(example: str) -> None:
    text = (SEED_DIR / example).read_text()
    extra = []
    if EXAMPLES[example]:
        name = "my-policy" if example.startswith("000") else "policy-3"
        extra.append((SEED_DIR / "002-pool.yaml").read_text().replace("policy-3", name))
    res = compile_text(FLEET, text, *extra)
    assert res.errors == []
    for key, st in res.policy_status.items():
        assert st.warnings == [], (key, st.warnings)
        assert st.state == "Accepted"
    assert [w.code for w in res.document_warnings] == (
        ["PolicyRefList"] if example == "001-guide-alice.yaml" else [])


def test_seed_pool_example_lints_clean_and_counts_destinations() -> None:
    text = (SEED_DIR / "002-pool.yaml").read_text()
    policy = (SEED_DIR / "001-guide-policy-3.yaml").read_text()
    res = compile_text(FLEET, text, policy)
    assert res.errors == [] and res.document_warnings == []
    st = res.pool_status[("default", "inference-all")]
    assert st.destination_count == 3 and st.state == "Accepted"
    assert {m.name: m.served_by for m in st.models} == {
        "gemma-4": ["gemma-4-12b"], "qwen-2.5": ["databricks", "qwen-2-5-32b"]}


def test_guide_list_policy_ref_is_used_with_a_warning() -> None:
    res = compile_text(FLEET, (SEED_DIR / "001-guide-alice.yaml").read_text())
    [w] = res.document_warnings
    assert w.code == "PolicyRefList" and "policyRef: {name: my-policy}" in w.message
    assert res.pool_status[("default", "inference-local")].state == "Accepted"
    assert res.pools[("default", "inference-local")].policy.name == "my-policy"
