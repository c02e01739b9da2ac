"""The peers' routing algorithms, re-implemented from their documentation.

Each router sees what the fleet gives every router (:mod:`.fleet`): the
telemetry collector's derived :class:`EndpointState` per pod, scraped at an
interval and delivered late, plus what it records of its own sends. Where a
peer keeps an approximate prefix index of its own picks, it is the same
block-level LRU structure (:class:`kinference_common.engine.PrefixIndex`,
256-character blocks, about 64 tokens) for every router, so that the
comparison is between decisions, not between hash granularities. Requests
only go to pods serving the request's model (as one InferencePool per base
model, or a router per model, would do).

Written from descriptions, never from the peers' code.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from kinference_common.engine import PrefixIndex
from kinference_common.messages import EndpointState

from .fleet import PodSpec, ProviderSpec, Router
from .workloads import SimRequest


class _Base(Router):
    def setup(self, pods: Sequence[PodSpec], providers: Sequence[ProviderSpec], rng: random.Random) -> None:
        super().setup(pods, providers, rng)
        self.by_model: dict[str, list[str]] = {}
        for p in pods:
            self.by_model.setdefault(p.model, []).append(p.key)
        self.state: dict[str, EndpointState] = {}
        self.scraped_at: dict[str, float] = {}
        #: key -> requests this router has open (sent, not finished)
        self.in_flight: dict[str, int] = {p.key: 0 for p in pods}
        self._where: dict[str, str] = {}

    def on_telemetry(self, state: EndpointState, now: float) -> None:
        self.state[f"{state.namespace}/{state.worker_set}/{state.pod}"] = state

    def candidates(self, req: SimRequest) -> list[str]:
        return self.by_model.get(req.model, [])

    def sent(self, req: SimRequest, key: str) -> str:
        self.in_flight[key] += 1
        self._where[req.id] = key
        return key

    def on_finished(self, req: SimRequest, now: float) -> None:
        key = self._where.pop(req.id, None)
        if key is not None:
            self.in_flight[key] -= 1


class RoundRobin(_Base):
    """Round robin over the pods serving the model: what a Kubernetes Service
    (kube-proxy) or vllm-router ``--policy round_robin`` does."""

    name = "round_robin"

    def setup(self, pods, providers, rng) -> None:  # noqa: ANN001
        super().setup(pods, providers, rng)
        self._next: dict[str, int] = {}

    def pick(self, req: SimRequest, now: float) -> str | None:
        cands = self.candidates(req)
        if not cands:
            return None
        i = self._next.get(req.model, 0)
        self._next[req.model] = i + 1
        return self.sent(req, cands[i % len(cands)])


class LeastQueue(_Base):
    """Least queue: the pod with the fewest waiting requests, as scraped
    (``vllm:num_requests_waiting``), plus this router's sends since that
    scrape (which the scrape cannot show yet); ties by the router's own
    requests in flight, then at random. The queue-only scorer of the
    Gateway API Inference Extension (``queue-scorer``) and Envoy's
    least-request balancing are both this family; the correction for
    unseen sends is what keeps it from herding between scrapes."""

    name = "least_queue"

    def setup(self, pods, providers, rng) -> None:  # noqa: ANN001
        super().setup(pods, providers, rng)
        self._since: dict[str, list[float]] = {p.key: [] for p in pods}

    def on_telemetry(self, state: EndpointState, now: float) -> None:
        super().on_telemetry(state, now)
        key = f"{state.namespace}/{state.worker_set}/{state.pod}"
        t = state.scraped_at - _epoch()
        self._since[key] = [s for s in self._since[key] if s > t]

    def pick(self, req: SimRequest, now: float) -> str | None:
        cands = self.candidates(req)
        if not cands:
            return None
        best, tied = None, []
        for k in cands:
            st = self.state.get(k)
            q = (st.queued or 0) if st is not None else 0
            v = (q + len(self._since[k]), self.in_flight[k])
            if best is None or v < best:
                best, tied = v, [k]
            elif v == best:
                tied.append(k)
        key = tied[self.rng.randrange(len(tied))]
        self._since[key].append(now)
        return self.sent(req, key)


class GieDefault(_Base):
    """The Gateway API Inference Extension's default endpoint picker (EPP):
    scorers ``queue-scorer`` (weight 2), ``kv-cache-utilization-scorer`` (2)
    and ``prefix-cache-scorer`` (3), summed, then ``max-score-picker`` (the
    highest total; ties at random).

    Source: the project's documentation of its default scheduling profile
    (gateway-api-inference-extension.sigs.k8s.io, "Prefix Cache Aware
    Routing"; the weights 2/2/3 as its default config and the llm-d /
    OpenShift AI docs quote them). Scores, each in [0, 1]:

    - queue: ``(max_q - q) / (max_q - min_q)`` over the candidates' scraped
      waiting queues, 1 for all when equal;
    - KV cache: ``1 - kv_cache_usage`` as scraped;
    - prefix: the fraction of the prompt's blocks the pod was sent before,
      from an LRU index of this picker's own picks (the plugin's
      scheduling-history estimate; recorded when the pick is made).

    It reads only scraped metrics for load (no correction for its own sends
    between scrapes), as the EPP's datastore does.
    """

    name = "gie_default"
    weights = (2.0, 2.0, 3.0)

    def setup(self, pods, providers, rng) -> None:  # noqa: ANN001
        super().setup(pods, providers, rng)
        self.prefix = PrefixIndex(max_blocks_per_endpoint=1 << 20, max_holders_per_block=64)

    def pick(self, req: SimRequest, now: float) -> str | None:
        cands = self.candidates(req)
        if not cands:
            return None
        hashes = req.router_hashes or ()
        matches = self.prefix.match(hashes) if hashes else {}
        qs = [(self.state[k].queued or 0) if k in self.state else 0 for k in cands]
        lo, hi = min(qs), max(qs)
        wq, wk, wp = self.weights
        best, tied = None, []
        for k, q in zip(cands, qs):
            st = self.state.get(k)
            qscore = 1.0 if hi == lo else (hi - q) / (hi - lo)
            kv = st.kv_cache_usage if st is not None and st.kv_cache_usage is not None else 0.0
            pscore = matches.get(k, 0) / len(hashes) if hashes else 0.0
            s = wq * qscore + wk * (1.0 - kv) + wp * pscore
            if best is None or s > best + 1e-12:
                best, tied = s, [k]
            elif abs(s - best) <= 1e-12:
                tied.append(k)
        key = tied[self.rng.randrange(len(tied))]
        if hashes:
            self.prefix.record(key, hashes)
        return self.sent(req, key)


class LlmdSticky(_Base):
    """llm-d's "sticky until saturated" profile (its optimized-baseline
    guide): ``prefix-cache-affinity-filter`` then ``token-load-scorer`` and
    ``max-score-picker``.

    Source: llm-d's optimized-baseline guide (llm-d.ai, "Optimized
    Baseline") and the router's plugin documentation as quoted by its
    users: the filter keeps the endpoints whose prefix-cache score (the
    fraction of the prompt's blocks an approximate index of the scheduler's
    own picks says they hold) is at least ``affinityThreshold`` 0.80; a load
    gate reopens the whole set when the best sticky endpoint's estimated
    TTFT exceeds the best endpoint's by more than ``maxTTFTPenaltyMs``
    (18,000 ms), TTFT estimated as in-flight tokens / ``peakPrefillThroughput``
    (15,928 tokens/s, its default, within 5% of the simulated H100's
    prefill rate); with probability ``epsilon`` (0.01) the filter is
    skipped (exploration). ``token-load-scorer`` then prefers the endpoint
    with the fewest in-flight tokens (the prompt tokens, less its prefix
    match, of the requests this scheduler has open there).
    """

    name = "llmd_sticky"
    affinity_threshold = 0.80
    max_ttft_penalty_ms = 18_000.0
    peak_prefill_tps = 15_928.0
    epsilon = 0.01

    def setup(self, pods, providers, rng) -> None:  # noqa: ANN001
        super().setup(pods, providers, rng)
        self.prefix = PrefixIndex(max_blocks_per_endpoint=1 << 20, max_holders_per_block=64)
        self.tokens: dict[str, float] = {p.key: 0.0 for p in pods}
        self._tok: dict[str, float] = {}

    def pick(self, req: SimRequest, now: float) -> str | None:
        cands = self.candidates(req)
        if not cands:
            return None
        hashes = req.router_hashes or ()
        matches = self.prefix.match(hashes) if hashes else {}
        n = len(hashes)
        score = {k: (matches.get(k, 0) / n if n else 0.0) for k in cands}
        pool = cands
        sticky = [k for k in cands if score[k] >= self.affinity_threshold]
        if sticky and self.rng.random() >= self.epsilon:
            ttft = {k: self.tokens[k] / self.peak_prefill_tps * 1000.0 for k in cands}
            if min(ttft[k] for k in sticky) - min(ttft.values()) <= self.max_ttft_penalty_ms:
                pool = sticky
        low = min(self.tokens[k] for k in pool)
        tied = [k for k in pool if self.tokens[k] == low]
        key = tied[self.rng.randrange(len(tied))]
        uncached = req.prompt_tokens * (1.0 - score[key])
        self.tokens[key] += uncached
        self._tok[req.id] = uncached
        if hashes:
            self.prefix.record(key, hashes)
        return self.sent(req, key)

    def on_finished(self, req: SimRequest, now: float) -> None:
        key = self._where.get(req.id)
        if key is not None:
            self.tokens[key] -= self._tok.pop(req.id, 0.0)
        super().on_finished(req, now)


class VllmRouterCacheAware(_Base):
    """vllm-router's ``--policy cache_aware`` (the vLLM project's Rust
    router, PyPI ``vllm-router`` 0.1.17; inherited from SGLang's router).

    Source: ``vllm-router --help`` (defaults ``--cache-threshold 0.3``,
    ``--balance-abs-threshold 64``, ``--balance-rel-threshold 1.5``), the
    router's load-balancing documentation, and probes of the binary
    (``python -m bench.routing.crosscheck`` and the cross-check section of
    docs/routing-benchmark.md). The router counts the requests it has open
    to each worker (its load: up at the pick, down when the response ends).
    When the load is imbalanced (``max - min > abs_threshold`` and
    ``max > rel_threshold * min``, over all workers) the request goes to the
    least loaded worker. Otherwise the prompt's token ids (which it asks
    each worker's ``/tokenize`` for) are matched against an approximate
    radix tree of what the router sent to each worker: if the best match
    covers more than ``cache_threshold`` of the prompt, the request goes to
    the worker with the longest match; else to the least loaded worker,
    ties to the one it has sent the fewest requests so far (measured: with
    an idle small-tree worker and a busy one, the busy one is never picked;
    the documentation's older "smallest tree" rule is not what 0.1.17
    does). The prompt is then inserted under the chosen worker. The tree is
    token-level in vllm-router; here it is the shared 256-character block
    index (the match fraction differs by less than one 64-token block, and
    no workload here has a shared fraction near the 0.3 threshold). No
    engine metrics are read.
    """

    name = "vllm_router_cache_aware"
    cache_threshold = 0.3
    balance_abs = 64
    balance_rel = 1.5

    def setup(self, pods, providers, rng) -> None:  # noqa: ANN001
        super().setup(pods, providers, rng)
        self.prefix = PrefixIndex(max_blocks_per_endpoint=1 << 22, max_holders_per_block=64)
        #: requests sent to each worker so far (the least-load tie-break)
        self.routed: dict[str, int] = {p.key: 0 for p in pods}

    def allowed(self, req: SimRequest) -> list[str]:
        """The workers the rule allows for ``req`` now, in worker order (more
        than one only on ties; :meth:`pick` takes the first)."""
        cands = self.candidates(req)
        if not cands:
            return []
        loads = [self.in_flight[k] for k in cands]
        hi, lo = max(loads), min(loads)
        hashes = req.router_hashes or ()
        if not (hi - lo > self.balance_abs and hi > self.balance_rel * lo):
            matches = self.prefix.match(hashes) if hashes else {}
            best = max((matches.get(k, 0) for k in cands), default=0)
            if hashes and best / len(hashes) > self.cache_threshold:
                return [k for k in cands if matches.get(k, 0) == best]
        least = min((self.in_flight[k], self.routed[k]) for k in cands)
        return [k for k in cands if (self.in_flight[k], self.routed[k]) == least]

    def commit(self, req: SimRequest, key: str) -> str:
        """Record that ``req`` went to ``key`` (the tree, the counts)."""
        if req.router_hashes:
            self.prefix.record(key, req.router_hashes)
        self.routed[key] += 1
        return self.sent(req, key)

    def pick(self, req: SimRequest, now: float) -> str | None:
        allowed = self.allowed(req)
        return self.commit(req, allowed[0]) if allowed else None


def _epoch() -> float:
    from .fleet import EPOCH

    return EPOCH


PEERS: dict[str, type[Router]] = {
    "round_robin": RoundRobin,
    "least_queue": LeastQueue,
    "gie_default": GieDefault,
    "llmd_sticky": LlmdSticky,
    "vllm_router_cache_aware": VllmRouterCacheAware,
}
