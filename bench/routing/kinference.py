"""Kinference in the fleet: the real compiler, snapshot and ``decide()``.

The router under test is the product's decision path without its HTTP and
NATS shells, wired as ``services/router`` wires it:

- the pool, worker sets, providers and policy are YAML manifests compiled by
  :mod:`kinference_common.compiler` (the policy compiler's own code);
- each telemetry delivery updates the endpoint's state and tells the
  :class:`InFlightLedger` what the scrape already counts
  (``ledger.observed``); the :class:`Snapshot` is rebuilt at most every
  ``rebuild_interval`` (50 ms, the router's coalescing tick) and at least
  every ``max_age`` (0.5 s) when telemetry changed;
- a request is estimated (prompt tokens by the engine's estimator, block
  hashes by its prefix-block function), decided by :func:`decide`; the pick
  joins the ledger with the decision's ``prefill_tokens`` and the prefix
  index records it; its first token feeds :class:`Calibration` with the
  uncalibrated prediction, as the router's ``_first_token`` does.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import msgspec

from kinference_common.compiler import compile_documents
from kinference_common.engine import Calibration, InFlightLedger, PrefixIndex, Request, Snapshot, TTFTModel, decide
from kinference_common.engine.tokens import estimate_tokens
from kinference_common.manifests import load_text
from kinference_common.messages import EndpointState, ProviderState

from .fleet import EPOCH, NAMESPACE, PodSpec, ProviderSpec, Router
from .workloads import SimRequest

POOL = "bench"

#: the policy the sweep runs: every request to the local pod that will answer first
FASTEST_LOCAL = """
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePolicy
metadata: {name: fastest-local, namespace: default}
spec:
  rules:
    - name: fastest-local
      route:
        select:
          - { type: Local, minimize: PredictedTTFT }
        tieBreak: [PrefixAffinity, LeastInFlight, Random]
"""

#: the seeds' burst-unless-PII policy (deploy/examples/10-burst-policy.yaml)
BURST_UNLESS_PII = """
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePolicy
metadata: {name: burst-unless-pii, namespace: default}
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
          - { type: Provider, order: [cloud] }
"""


def manifests(pods: Sequence[PodSpec], providers: Sequence[ProviderSpec], policy_yaml: str) -> str:
    """Worker sets (one per distinct worker set of ``pods``), providers, the
    policy and a pool naming them all."""
    docs = []
    sets: dict[str, PodSpec] = {}
    for p in pods:
        sets.setdefault(p.worker_set, p)
    models = sorted({p.model for p in pods})
    for ws, p in sets.items():
        docs.append(f"""
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: {{name: {ws}, namespace: {NAMESPACE}}}
spec:
  model: {{name: {p.model}, contextWindow: {p.max_model_len}}}
  engine: vLLM
  selector: {{matchLabels: {{app: {ws}}}}}
  port: 8000
""")
    for pr in providers:
        model_lines = "".join(f"\n    - {{name: {m}, upstreamName: {m}-cloud, contextWindow: 131072}}"
                              for m in models)
        docs.append(f"""
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceProvider
metadata: {{name: {pr.name}, namespace: {NAMESPACE}}}
spec:
  url: http://127.0.0.1:9/v1
  auth: {{secretRef: {{name: cloud-token, key: token}}}}
  models:{model_lines}
""")
    docs.append(policy_yaml)
    name = policy_yaml.split("name:", 1)[1].split(",", 1)[0].strip()
    dests = "".join(f"\n    - {{kind: InferenceWorkerSet, name: {ws}}}" for ws in sets) + "".join(
        f"\n    - {{kind: InferenceProvider, name: {pr.name}}}" for pr in providers)
    docs.append(f"""
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePool
metadata: {{name: {POOL}, namespace: {NAMESPACE}}}
spec:
  destinations:{dests}
  policyRef: {{name: {name}}}
""")
    return "\n---\n".join(d.strip("\n") for d in docs)


def compile_pool(pods: Sequence[PodSpec], providers: Sequence[ProviderSpec], policy_yaml: str):  # noqa: ANN201
    res = compile_documents(load_text(manifests(pods, providers, policy_yaml), "bench/routing"))
    if res.errors:
        raise ValueError(f"bench manifests do not compile: {res.errors}")
    for key, pool in res.pools.items():
        if pool.name == POOL:
            return pool
    raise ValueError(f"pool {POOL} did not compile: {res.pool_status}")


class Kinference(Router):
    """The product's decision through ``decide()`` on a compiled policy."""

    name = "kinference"

    def __init__(self, policy_yaml: str = FASTEST_LOCAL, *, rebuild_interval: float = 0.05,
                 max_age: float = 0.5, tags_of=None, name: str | None = None,  # noqa: ANN001
                 fixed: bool = True) -> None:
        """``fixed=False`` runs the engine as it was before the benchmark's
        fixes (no PredictedTTFT tie tolerance, a prefix index not sized to
        each endpoint's KV cache): the "before" of the before/after rows."""
        self.fixed = fixed
        self.policy_yaml = policy_yaml
        self.rebuild_interval = rebuild_interval
        self.max_age = max_age
        self.tags_of = tags_of
        if name:
            self.name = name

    def setup(self, pods, providers, rng: random.Random) -> None:  # noqa: ANN001
        super().setup(pods, providers, rng)
        self.pool = compile_pool(pods, providers, self.policy_yaml)
        self.ledger = InFlightLedger()
        self.prefix = PrefixIndex()
        self.calibration = Calibration()
        self.endpoints: dict[str, EndpointState] = {}
        self.provider_states = [ProviderState(namespace=NAMESPACE, name=p.name) for p in providers]
        self.snapshot: Snapshot | None = None
        self._base_model = TTFTModel() if self.fixed else TTFTModel(tie_tolerance=0.0, tie_tolerance_seconds=0.0,
                                                                               prefix_stickiness=0.0)
        self._model = self._base_model
        self._dirty = True
        self._built = -1e9
        self._sends: dict[str, tuple[object, float | None, float]] = {}
        self.decisions = 0
        self.provider_sends = 0

    def on_telemetry(self, state: EndpointState, now: float) -> None:
        key = f"{state.namespace}/{state.worker_set}/{state.pod}"
        self.endpoints[key] = state
        if state.scraped_at:
            self.ledger.observed(key, state.scraped_at)
        self._dirty = True

    def _snap(self, now: float) -> Snapshot:
        due = self._dirty and now - self._built >= self.rebuild_interval
        if self.snapshot is None or due or now - self._built >= self.max_age:
            c = round(self.calibration.value, 3)
            if c != self._model.calibration:
                self._model = msgspec.structs.replace(self._base_model, calibration=c)
            self.snapshot = Snapshot(self.pool, self.endpoints.values(), self.provider_states, now=EPOCH + now,
                                     ttft_model=self._model, rng=self.rng)
            self._dirty = False
            self._built = now
        return self.snapshot

    def request(self, req: SimRequest) -> Request:
        est = req.extra.get("estimate")
        if est is None:
            est = req.extra["estimate"] = estimate_tokens(req.text)
        tags = self.tags_of(req) if self.tags_of is not None else req.tags
        return Request(model=req.model, prompt_tokens=est, tags=tags, block_hashes=req.router_hashes or ())

    def pick(self, req: SimRequest, now: float) -> str | None:
        snap = self._snap(now)
        d = decide(snap, self.request(req), ledger=self.ledger, prefix=self.prefix, rng=self.rng)
        self.decisions += 1
        if not d.routed:
            return None
        cand = d.candidate
        predicted = None
        if cand.is_local:
            p = d.context.predicted_ttft(cand)
            predicted = p / snap.ttft_model.calibration if p else None
        send = self.ledger.sent(cand.ledger_key, d.prefill_tokens, EPOCH + now)
        if cand.is_local and req.router_hashes:
            self.prefix.record(cand.ledger_key, req.router_hashes, cand.cache_blocks if self.fixed else None)
        if not cand.is_local:
            self.provider_sends += 1
        self._sends[req.id] = (send, predicted, now)
        return cand.ledger_key

    def on_first_token(self, req: SimRequest, now: float) -> None:
        entry = self._sends.get(req.id)
        if entry is None:
            return
        send, predicted, sent_at = entry
        self.ledger.first_token(send)
        if predicted is not None:
            self.calibration.observe(now - sent_at, predicted)

    def on_finished(self, req: SimRequest, now: float) -> None:
        entry = self._sends.pop(req.id, None)
        if entry is not None:
            self.ledger.finished(entry[0])
