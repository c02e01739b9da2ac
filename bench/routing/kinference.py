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
  uncalibrated prediction, as the router's ``_first_token`` does;
- with ``share`` (:class:`ReplicaShare`), the replicas of one fleet share
  what they learn as ``services/router/replica_sync.py`` does over NATS: a
  send or a first token (the ledger's ``on_change``) publishes its ledger's
  :meth:`~InFlightLedger.summary` and its prefix index's journal, at most
  once per ``interval`` (at once when the last publish is older), and every
  ``heartbeat`` otherwise; each peer merges it ``delay`` later (the bus),
  and forgets a replica quiet for ``ttl``. Modelled in simulated time by the fleet's timer events.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec

from kinference_common.compiler import compile_documents
from kinference_common.engine import Calibration, InFlightLedger, PrefixIndex, Request, Snapshot, TTFTModel, decide
from kinference_common.engine.ledger import Send
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


@dataclass(frozen=True, slots=True)
class ReplicaShare:
    """Replica sync in simulated time (the router's defaults). The replicas
    know each other from the start; a real one publishes per change only
    once it has heard a peer (its first heartbeat, within 0.25 s of start)."""

    #: at most one publish per interval: a change publishes at once when the
    #: last publish is this old, else at the end of the interval
    #: (services/router/replica_sync.py's DEFAULT_INTERVAL)
    interval: float = 0.005
    #: seconds from publish to a peer's merge (NATS, one hop)
    delay: float = 0.002
    #: a peer quiet this long is forgotten
    ttl: float = 2.0
    #: a replica publishes at least this often (a heartbeat)
    heartbeat: float = 0.5


def link(routers: Sequence["Kinference"]) -> None:
    """Make sharing replicas know each other (the fleet's "NATS subject")."""
    for i, r in enumerate(routers):
        r.group = list(routers)
        r.replica_id = f"replica-{i}"


class Kinference(Router):
    """The product's decision through ``decide()`` on a compiled policy."""

    name = "kinference"

    def __init__(self, policy_yaml: str = FASTEST_LOCAL, *, rebuild_interval: float = 0.05,
                 max_age: float = 0.5, tags_of=None, name: str | None = None,  # noqa: ANN001
                 fixed: bool = True, share: ReplicaShare | None = None) -> None:
        """``fixed=False`` runs the engine as it was before the benchmark's
        fixes (no PredictedTTFT tie tolerance, a prefix index not sized to
        each endpoint's KV cache, each endpoint its own Theta): the "before"
        of the before/after rows."""
        self.fixed = fixed
        self.policy_yaml = policy_yaml
        self.rebuild_interval = rebuild_interval
        self.max_age = max_age
        self.tags_of = tags_of
        self.share = share
        self.group: list[Kinference] = [self]
        self.replica_id = "replica-0"
        if name:
            self.name = name

    def setup(self, pods, providers, rng: random.Random) -> None:  # noqa: ANN001
        super().setup(pods, providers, rng)
        self.pool = compile_pool(pods, providers, self.policy_yaml)
        self.ledger = InFlightLedger()
        self._now = 0.0
        self.prefix = PrefixIndex(clock=lambda: self._now)  # the simulation's time
        self.calibration = Calibration()
        self.endpoints: dict[str, EndpointState] = {}
        self.provider_states = [ProviderState(namespace=NAMESPACE, name=p.name) for p in providers]
        self.snapshot: Snapshot | None = None
        self._base_model = TTFTModel() if self.fixed else TTFTModel(tie_tolerance=0.0, tie_tolerance_seconds=0.0,
                                                                               prefix_stickiness=0.0,
                                                                               peer_prefill_rate=False)
        self._model = self._base_model
        self._dirty = True
        self._built = -1e9
        self._sends: dict[str, tuple[Send, float | None, float, bool]] = {}
        self.decisions = 0
        self.provider_sends = 0
        if self.share is not None:
            self.ledger.sharing = True
            self.prefix.start_journal()
            self._seq = 0
            self._published_version = -1
            self._published_at = -1e9
            self._due = False
            self._now = 0.0
            self.ledger.on_change = self._changed
            self.schedule(rng.uniform(0, self.share.heartbeat), self._heartbeat)

    def _changed(self) -> None:
        """A send or a first token: publish now when the last publish is
        ``interval`` old, else once at the end of the interval."""
        if self._due:
            return
        # after the current event (the router's call_soon): the pick's prefix record goes with it
        self._due = True
        self.schedule(max(self._now, self._published_at + self.share.interval), self._publish)

    def _heartbeat(self, now: float) -> None:
        self.ledger.expire_peers(EPOCH + now, self.share.ttl)
        if now - self._published_at >= self.share.heartbeat:
            self._publish(now)
        self.schedule(now + self.share.heartbeat / 2, self._heartbeat)

    def _publish(self, now: float) -> None:
        share = self.share
        self._due = False
        self._seq += 1
        summary = self.ledger.summary(EPOCH + now)
        records = self.prefix.take_journal()
        self._published_version, self._published_at = self.ledger.version, now
        for peer in self.group:
            if peer is not self:
                self.schedule(now + share.delay,
                              lambda t, p=peer, s=self._seq: p._receive(self.replica_id, s, summary, records, t))

    def _receive(self, replica: str, seq: int, summary, records, now: float) -> None:  # noqa: ANN001
        self._now = now
        if self.ledger.merge_peer(replica, seq, summary, EPOCH + now):
            for key, hashes, cap, kv in records:
                self.prefix.record_peer(key, hashes, cap, kv)

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
        self._now = now
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
            self.prefix.record(cand.ledger_key, req.router_hashes, cand.cache_blocks if self.fixed else None,
                               cand.kv if self.fixed else None)
        if not cand.is_local:
            self.provider_sends += 1
        self._sends[req.id] = (send, predicted, now, cand.is_local)
        return cand.ledger_key

    def on_first_token(self, req: SimRequest, now: float) -> None:
        entry = self._sends.get(req.id)
        if entry is None:
            return
        send, predicted, sent_at, _ = entry
        self._now = now
        self.ledger.first_token(send, EPOCH + now)
        if predicted is not None:
            self.calibration.observe(now - sent_at, predicted)

    def on_finished(self, req: SimRequest, now: float) -> None:
        entry = self._sends.pop(req.id, None)
        if entry is not None:
            self._now = now
            send = entry[0]
            self.ledger.finished(send, EPOCH + now)
            if entry[3] and self.fixed:  # an endpoint's answer: its length and prompt, as the router reads the usage
                self.prefix.observe_output(send.key, send.tokens, req.output_len, req.extra["estimate"],
                                           req.prompt_tokens)
