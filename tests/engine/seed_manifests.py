"""The seed examples as manifests (seed 000's burst policy, seed 001's alice
policies), with the worker sets, provider and pools they need."""

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

BURST = """
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePolicy
metadata: { name: my-policy, namespace: default }
spec:
  rules:
    - name: local-first-then-provider-unless-pii
      route:
        exclude:
          - name: drop-local-endpoints-with-big-queues
            drop:
              backend: { type: Local }
              queuedPrompts: { greaterThan: 4 }
          - name: drop-local-endpoints-with-no-kv-headroom
            drop:
              backend: { type: Local }
              kvCacheUsage: { greaterThan: 0.9 }
          - name: ensure-pii-never-leaves-cluster
            if: { tag: [pii-confirmed, pii-unknown] }
            drop: { backend: { type: Provider } }
        select:
          - { type: Local, minimize: PredictedTTFT }
          - { type: Provider, order: [databricks] }
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePool
metadata: { name: inference-all, namespace: default }
spec:
  destinations:
    - { kind: InferenceWorkerSet, name: gemma-4-12b }
    - { kind: InferenceWorkerSet, name: qwen-2-5-32b }
    - { kind: InferenceProvider, name: databricks }
  policyRef: { name: my-policy }
"""

ALICE = """
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePolicy
metadata: { name: my-policy, namespace: default }
spec:
  rules:
    - name: alice-qwen-to-gemma
      matches:
        - model: qwen-2.5
          tenant: alice
      route:
        consider:
          - models: { names: [gemma-4] }
        select: [{ type: Local, minimize: PredictedTTFT }]
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePolicy
metadata: { name: policy-3, namespace: default }
spec:
  rules:
    - name: alice-qwen-to-gemma-no-overloaded-endpoints
      matches:
        - model: qwen-2.5
          tenant: alice
      route:
        consider:
          - models: { names: [gemma-4, qwen-2.5] }
        exclude:
          - name: drop-by-queue-size
            drop:
              backend: { type: Local }
              queuedPrompts: { greaterThan: 4 }
        select: [{ type: Local, minimize: PredictedTTFT }]
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
