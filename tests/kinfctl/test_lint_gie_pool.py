"""kinfctl lint shows an Inference Extension pool Kinference serves: what it
compiles to, and the parents[] entries the compiler would write."""

from __future__ import annotations

import json

import msgspec
from kinfctl.lint import lint_json
from kinfctl.main import main

from kinference_common.compiler import compile_paths

from tests.compiler.conftest import FLEET, policy_yaml
from tests.compiler.test_gie_pool import BURST, GATEWAY, ROUTE, gie_pool


def test_lint_prints_the_gie_pool_and_its_parents(tmp_path, capsys) -> None:
    path = tmp_path / "m.yaml"
    path.write_text("---\n".join([FLEET, policy_yaml("p", BURST), ROUTE, GATEWAY, gie_pool()]))
    assert main(["lint", str(path)]) == 0
    out = capsys.readouterr().out
    assert "InferencePool.inference.networking.k8s.io default/llm: 1 destination(s), policy p" in out
    assert ("parent Gateway default/gw (kinference.buoyant.io/endpoint-picker): Accepted=True (Accepted), "
            "ResolvedRefs=True (ResolvedRefs)") in out
    # -o json prints lint_json (print_json's default stream is bound at import: read the value itself)
    [entry] = json.loads(msgspec.json.encode(lint_json(compile_paths([path]))))["giePools"]
    assert entry["name"] == "llm" and entry["status"]["parents"][0]["parentRef"]["name"] == "gw"
