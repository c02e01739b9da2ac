"""The manifests most router tests serve: one worker set (its endpoints are
the test's stand-ins), one policy, one pool."""

from __future__ import annotations

#: the rule's exclusion when local endpoints count as saturated past 4 queued prompts
BIG_QUEUES = """        exclude:
          - name: big-queues
            drop:
              backend: {type: Local}
              queuedPrompts: {greaterThan: 4}
"""


def one_worker_set_pool(pool: str, *, worker_set: str = "stub", model: str = "m", served_name: str = "m",
                        policy: str = "all-local", rule: str = "everything-local", exclude: str = "",
                        flow_control: str = "") -> str:
    """A pool ``default/<pool>`` over one worker set serving ``model``, whose
    policy's one rule sends everything local, fastest PredictedTTFT first
    (after ``exclude``, e.g. :data:`BIG_QUEUES`); ``flow_control`` is the
    pool's ``flowControl`` value, if any."""
    return f"""
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: {{name: {worker_set}, namespace: default}}
spec:
  model: {{name: {model}, servedName: {served_name}, contextWindow: 32768}}
  engine: vLLM
  selector: {{matchLabels: {{app: {worker_set}}}}}
  port: 8000
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePolicy
metadata: {{name: {policy}, namespace: default}}
spec:
  rules:
    - name: {rule}
      route:
{exclude}        select:
          - {{type: Local, minimize: PredictedTTFT}}
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePool
metadata: {{name: {pool}, namespace: default}}
spec:
  destinations:
    - {{kind: InferenceWorkerSet, name: {worker_set}}}
  policyRef: {{name: {policy}}}
""" + (f"  flowControl: {flow_control}\n" if flow_control else "")
