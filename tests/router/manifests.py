"""The manifests most router tests serve: one worker set (its endpoints are
the test's stand-ins), one policy, one pool."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from kinference_common.manifests import load_text

EXAMPLES = Path(__file__).resolve().parents[2] / "deploy" / "examples"

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


def example_documents(provider_address: str,
                      edit: Callable[[str, str], str] | None = None) -> list[Any]:
    """The documents of deploy/examples (the burst-unless-PII policy on its
    pool), the provider's URL pointed at ``provider_address`` (host:port);
    ``edit(file name, text)`` may change a file's text first."""
    docs: list[Any] = []
    for f in sorted(EXAMPLES.glob("*.yaml")):
        text = f.read_text().replace("http://127.0.0.1:8300/v1", f"http://{provider_address}/v1")
        docs += load_text(edit(f.name, text) if edit else text, str(f))
    return docs
