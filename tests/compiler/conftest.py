"""Helpers for compiler tests: compile YAML text, and a fleet of worker sets
and a provider for the seeds' examples (the seeds name them but never define
them)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from kinference_common.compiler import CompileResult, compile_documents
from kinference_common.manifests import load_text

SEED_DIR = Path(__file__).parent / "seed_manifests"
NOW = "2026-11-29T10:00:00Z"

FLEET = """
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: {name: gemma-4-12b, namespace: default}
spec:
  model: {name: gemma-4, aliases: [google/gemma-4-12b-it], servedName: google/gemma-4-12b-it, contextWindow: 8192}
  selector: {matchLabels: {app: gemma}}
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: {name: qwen-2-5-32b, namespace: default}
spec:
  model: {name: qwen-2.5, aliases: [Qwen/Qwen2.5-32B-Instruct], servedName: Qwen/Qwen2.5-32B-Instruct, contextWindow: 32768}
  selector: {matchLabels: {app: qwen}}
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: {name: gemma-4-vllm, namespace: default}
spec:
  model: {name: gemma-4}
  selector: {matchLabels: {app: gemma-vllm}}
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: {name: qwen-2-5-vllm, namespace: default}
spec:
  model: {name: qwen-2.5}
  selector: {matchLabels: {app: qwen-vllm}}
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceProvider
metadata: {name: databricks, namespace: default}
spec:
  url: https://example.cloud.databricks.com/serving-endpoints
  auth: {secretRef: {name: databricks-token, key: token}}
  models:
    - {name: qwen-2.5, upstreamName: databricks-qwen25-32b, contextWindow: 32768}
"""

POOL_ALL = """
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePool
metadata: {name: inference-all, namespace: default}
spec:
  destinations:
    - {kind: InferenceWorkerSet, name: gemma-4-12b}
    - {kind: InferenceWorkerSet, name: qwen-2-5-32b}
    - {kind: InferenceProvider, name: databricks}
  policyRef: {name: POLICY}
"""

CompileYaml = Callable[..., CompileResult]


def compile_text(*texts: str, **kwargs: object) -> CompileResult:
    loaded = []
    for i, t in enumerate(texts):
        loaded.extend(load_text(t, f"doc{i}.yaml"))
    return compile_documents(loaded, now=NOW, **kwargs)  # type: ignore[arg-type]


def policy_yaml(name: str, spec: str, namespace: str = "default") -> str:
    indented = "\n".join("  " + line for line in spec.strip("\n").splitlines())
    return (
        "apiVersion: kinference.buoyant.io/v1alpha1\nkind: InferencePolicy\n"
        f"metadata: {{name: {name}, namespace: {namespace}}}\nspec:\n{indented}\n"
    )


@pytest.fixture
def compile_yaml() -> CompileYaml:
    return compile_text
