"""The seed examples as manifests (seed 000's burst policy, seed 001's alice
policies), with the worker sets, provider and pools they need."""

from pathlib import Path

WORKLOADS = """
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: { name: qwen-2-5-32b, namespace: default }
spec:
  model:
    name: qwen-2.5
    aliases: [Qwen/Qwen2.5-32B-Instruct]
    servedName: Qwen/Qwen2.5-32B-Instruct
    contextWindow: 32768
  selector: { matchLabels: { app: qwen-vllm } }
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: { name: gemma-4-12b, namespace: default }
spec:
  model:
    name: gemma-4
    servedName: google/gemma-4-12b-it
    contextWindow: 131072
  selector: { matchLabels: { app: gemma-vllm } }
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceProvider
metadata: { name: databricks, namespace: default }
spec:
  url: https://example.cloud.databricks.com/serving-endpoints
  auth: { secretRef: { name: databricks-token, key: token } }
  models:
    - { name: qwen-2.5, upstreamName: databricks-qwen25-32b, contextWindow: 32768 }
"""

#: the seeds' example manifests, verbatim, shared with the compiler tests
SEEDS = Path(__file__).resolve().parents[1] / "compiler" / "seed_manifests"


def _seed(name: str) -> str:
    return (SEEDS / name).read_text()


#: seed 000's burst policy on seed 002's pool (which names it)
BURST = _seed("000-burst-policy.yaml") + "\n---\n" + _seed("002-pool.yaml").replace("policy-3", "my-policy")

#: seed 001's two policies (the first as the guide writes it, list-shaped
#: policyRef dropped with its pool), on pools of the workloads above
ALICE = _seed("001-guide-alice.yaml").split("\n---\n")[0] + "\n---\n" + _seed("001-guide-policy-3.yaml") + """
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePool
metadata: { name: inference-local, namespace: default }
spec:
  destinations:
    - { kind: InferenceWorkerSet, name: gemma-4-12b }
    - { kind: InferenceWorkerSet, name: qwen-2-5-32b }
  policyRef:
    - name: my-policy
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePool
metadata: { name: inference-3, namespace: default }
spec:
  destinations:
    - { kind: InferenceWorkerSet, name: gemma-4-12b }
    - { kind: InferenceWorkerSet, name: qwen-2-5-32b }
  policyRef: { name: policy-3 }
"""
