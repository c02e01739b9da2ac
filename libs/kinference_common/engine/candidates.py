"""Candidates (POLICY.md section 2), built once per snapshot from telemetry.

A candidate is one place a request could go:

- **Local**: one endpoint (vLLM pod) of a worker set of the pool, from its
  :class:`~kinference_common.messages.EndpointState`;
- **Provider**: one provider of the pool *per model it serves*, from its
  :class:`~kinference_common.messages.ProviderState`.

Everything about a candidate that does not depend on the request is computed
here, once per telemetry change: its signals, its built-in status (not ready,
ejected, stale) and the request-independent parts of its PredictedTTFT.
Candidates are plain ``__slots__`` objects: the decision reads their
attributes in tight loops.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable

from kinference_common.compiled import CompiledPool, Destination
from kinference_common.messages import EndpointState, ProviderState

from .tokens import BLOCK_CHARS
from .ttft import TTFTModel

#: tokens in one prompt block, at about four characters a token
_TOKENS_PER_BLOCK = BLOCK_CHARS // 4


def endpoint_key(namespace: str, worker_set: str, pod: str) -> str:
    """The ledger, ejection and prefix-index key of an endpoint."""
    return f"{namespace}/{worker_set}/{pod}"


def provider_key(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


class Candidate:
    """One place a request could be sent, with its request-independent state."""

    __slots__ = (
        "index", "id", "type", "is_local", "backend", "dest_name", "endpoint", "model",
        "served_name", "context_window", "ledger_key", "stale", "builtin",
        # signals; None = unknown
        "queued", "running", "kv", "gpu_util", "gpu_mem", "est_ttft", "error_rate",
        # PredictedTTFT parts (see ttft.py)
        "t0", "theta", "per_token", "kv_free", "hit_rate", "base_queue_tokens",
        # prompt blocks (tokens.BLOCK_CHARS) the endpoint's KV cache holds; None = unknown
        "cache_blocks",
        "state",
    )

    index: int
    id: str
    type: str
    is_local: bool
    backend: str
    dest_name: str
    endpoint: str | None
    model: str
    served_name: str
    context_window: int | None
    ledger_key: str
    stale: bool
    builtin: str | None
    queued: int | None
    running: int | None
    kv: float | None
    gpu_util: float | None
    gpu_mem: float | None
    est_ttft: float | None
    error_rate: float | None
    t0: float
    theta: float
    per_token: float
    kv_free: float | None
    hit_rate: float | None
    base_queue_tokens: float
    cache_blocks: int | None
    state: EndpointState | ProviderState | None

    def __repr__(self) -> str:
        return f"Candidate({self.id})"


def local_candidate(
    dest: Destination,
    ep: EndpointState,
    *,
    now: float,
    stale_after: float,
    ejected: frozenset[str] | set[str],
    theta_fallback: float,
    t0_fallback: float,
    model: TTFTModel,
    peer_theta: dict[int, float] | None = None,
) -> Candidate:
    """``peer_theta``: the largest Theta learned by the worker set's
    endpoints of each KV capacity (:func:`fallbacks`)."""
    served = dest.models[0]
    c = Candidate()
    c.type, c.is_local = "Local", True
    c.dest_name = dest.name
    c.backend = f"Local/{dest.name}"
    c.endpoint = ep.pod
    c.id = f"Local/{dest.name}/{ep.pod}"
    c.model = served.name
    c.served_name = served.served_name or served.name
    c.context_window = ep.context_window or served.context_window
    c.ledger_key = endpoint_key(ep.namespace, ep.worker_set, ep.pod)
    c.state = ep
    c.stale = now - ep.scraped_at > stale_after
    if not ep.ready:
        c.builtin = "notReady"
    elif c.ledger_key in ejected:
        c.builtin = "ejected"
    else:
        c.builtin = None
    if c.stale:
        c.queued = c.running = None
        c.kv = c.gpu_util = c.gpu_mem = None
        c.hit_rate = None
        c.kv_free = None
    else:
        c.queued, c.running, c.kv = ep.queued, ep.running, ep.kv_cache_usage
        c.gpu_util, c.gpu_mem = ep.gpu_utilization, ep.gpu_memory_usage
        c.hit_rate = ep.prefix_cache_hit_rate
        if ep.kv_cache_usage is not None and ep.kv_capacity_tokens:
            c.kv_free = max(0.0, (1.0 - ep.kv_cache_usage) * ep.kv_capacity_tokens)
        else:
            c.kv_free = None
    c.est_ttft = c.error_rate = None
    # static (the engine's configuration), so known even when the scrape is stale
    c.cache_blocks = ep.kv_capacity_tokens // _TOKENS_PER_BLOCK if ep.kv_capacity_tokens else None
    theta = ep.prefill_tokens_per_second
    c.theta = theta if theta and theta > 0 else theta_fallback
    if peer_theta and ep.kv_capacity_tokens in peer_theta:
        c.theta = max(c.theta, peer_theta[ep.kv_capacity_tokens])
    c.t0 = (
        ep.fixed_overhead_seconds
        if ep.fixed_overhead_seconds is not None and ep.fixed_overhead_seconds >= 0
        else t0_fallback
    )
    running = c.running or 0
    c.per_token = (1.0 + model.running_slowdown * running) / c.theta
    c.base_queue_tokens = (c.queued or 0) * model.queued_prompt_tokens
    return c


def _provider(
    dest: Destination, served_index: int, state: ProviderState | None, *, now: float,
    provider_stale_after: float, ejected: frozenset[str] | set[str] = frozenset(),
) -> Candidate:
    served = dest.models[served_index]
    c = Candidate()
    c.type, c.is_local = "Provider", False
    c.dest_name = dest.name
    c.backend = f"Provider/{dest.name}"
    c.endpoint = None
    c.id = c.backend if len(dest.models) == 1 else f"{c.backend}:{served.name}"
    c.model = served.name
    c.served_name = served.served_name or served.name
    c.context_window = served.context_window
    c.ledger_key = provider_key(dest.namespace, dest.name)
    c.state = state
    c.stale = False
    # a provider cooling down after a 429 (Retry-After) is "ejected" like an endpoint
    c.builtin = "ejected" if c.ledger_key in ejected else None
    c.queued = c.running = None
    c.kv = c.gpu_util = c.gpu_mem = None
    fresh = state is not None and (
        provider_stale_after <= 0 or not state.updated_at or now - state.updated_at <= provider_stale_after
    )
    c.est_ttft = state.estimated_ttft_seconds if fresh and state is not None else None
    c.error_rate = state.error_rate if fresh and state is not None else None
    c.t0 = 0.0
    c.theta = 0.0
    c.per_token = 0.0
    c.kv_free = None
    c.hit_rate = None
    c.base_queue_tokens = 0.0
    c.cache_blocks = None
    return c


def _has_t0(ep: EndpointState) -> bool:
    return ep.fixed_overhead_seconds is not None and ep.fixed_overhead_seconds >= 0


def local_groups(pool: CompiledPool, endpoints: Iterable[EndpointState]) -> dict[tuple[str, str], list[EndpointState]]:
    """The endpoints of the pool's worker sets, by ``(namespace, worker set)``
    (those of worker sets the pool does not route to are left out)."""
    local_dests = local_dest_index(pool)
    by_dest: dict[tuple[str, str], list[EndpointState]] = {}
    for ep in endpoints:
        key = (ep.namespace, ep.worker_set)
        if key in local_dests:
            by_dest.setdefault(key, []).append(ep)
    return by_dest


#: per worker set: ``(Theta, T0)`` for an endpoint that learned neither, and
#: the largest Theta learned per KV capacity (``((capacity, Theta), ...)``)
Fallback = tuple[float, float, tuple[tuple[int, float], ...]]


def peer_thetas(eps: Iterable[EndpointState]) -> tuple[tuple[int, float], ...]:
    """The largest Theta learned by endpoints of each KV capacity (in tokens),
    in capacity order.

    Theta is learned per endpoint as the largest prefill rate its own recent
    windows show (``kinference_collector.derive``), each a lower bound of what
    the engine can do, and tight only when the window held long prefills.
    Endpoints of one worker set with the same KV capacity run the same engine
    on the same GPUs (the capacity follows from the GPU's memory, the model
    and the engine's settings), so the largest of their estimates is the
    best bound for each of them. Taken alone, an endpoint whose first
    prefills overlapped learned a lower rate (a trial: 12,900 tokens/s
    against its three peers' 15,900), was predicted 20-25% slower for every
    prompt without a cached prefix, so was never given the long prefill
    that would have taught it otherwise, and held half the prefixes of its
    peers while their caches evicted (docs/routing-benchmark.md). Pods of
    other hardware in the same worker set differ in capacity and keep their
    own.

    Only ready endpoints count (a pod that went away stays known, not
    ready, and its rate must not hold its former peers up). Every move of
    the bound rebuilds the endpoints of that capacity
    (:meth:`.snapshot.Snapshot.updated`), in a worker set of one GPU type
    all of them: each endpoint's Theta is a sliding maximum over a minute,
    so the bound moves a few times a minute. Rounding it to three figures
    to move it less changed the fleet benchmark's saturated ``chat`` tail
    by 21% (its tail flips with any change), so it is exact."""
    best: dict[int, float] = {}
    for e in eps:
        theta, cap = e.prefill_tokens_per_second, e.kv_capacity_tokens
        if e.ready and cap and theta and theta > 0 and theta > best.get(cap, 0.0):
            best[cap] = theta
    return tuple(sorted(best.items()))


def fallbacks(by_dest: dict[tuple[str, str], list[EndpointState]],
              model: TTFTModel) -> dict[tuple[str, str], Fallback]:
    """Per worker set, the ``(Theta, T0)`` an endpoint that has not learned its
    own is given: its worker set's median, then the pool's, then the model's
    default; and its endpoints' largest Theta per KV capacity
    (:func:`peer_thetas`), which an endpoint of that capacity is given when
    its own is lower."""
    known = [
        ep.prefill_tokens_per_second
        for eps in by_dest.values()
        for ep in eps
        if ep.prefill_tokens_per_second and ep.prefill_tokens_per_second > 0
    ]
    pool_theta = statistics.median(known) if known else model.default_prefill_tps
    known_t0 = [ep.fixed_overhead_seconds for eps in by_dest.values() for ep in eps if _has_t0(ep)]
    pool_t0 = statistics.median(known_t0) if known_t0 else model.default_overhead_seconds
    out = {}
    for key, eps in by_dest.items():
        ws_known = [e.prefill_tokens_per_second for e in eps
                    if e.prefill_tokens_per_second and e.prefill_tokens_per_second > 0]
        # an endpoint that has served nothing yet has no learned T0: its
        # worker set's (then the pool's) median, like Theta. A fixed default
        # above what the busy endpoints learned would make the idle ones look
        # slower, so they would never get the request that teaches them.
        ws_t0 = [e.fixed_overhead_seconds for e in eps if _has_t0(e)]
        out[key] = (statistics.median(ws_known) if ws_known else pool_theta,
                    statistics.median(ws_t0) if ws_t0 else pool_t0,
                    peer_thetas(eps) if model.peer_prefill_rate else ())
    return out


def local_dest_index(pool: CompiledPool) -> dict[tuple[str, str], Destination]:
    """The pool's worker sets that serve a model, by ``(namespace, name)``."""
    return {(d.namespace, d.name): d for d in pool.destinations if d.type == "Local" and d.models}


def provider_candidates(pool: CompiledPool, providers: Iterable[ProviderState], *, now: float,
                        provider_stale_after: float, ejected: frozenset[str] | set[str]) -> list[Candidate]:
    """One candidate per provider of the pool and model it serves, in pool order."""
    prov_states = {(p.namespace, p.name): p for p in providers}
    out = []
    for dest in pool.destinations:
        if dest.type != "Provider":
            continue
        state = prov_states.get((dest.namespace, dest.name))
        for i in range(len(dest.models)):
            out.append(_provider(dest, i, state, now=now, provider_stale_after=provider_stale_after,
                                 ejected=ejected))
    return out


def build_candidates(
    pool: CompiledPool,
    endpoints: Iterable[EndpointState],
    providers: Iterable[ProviderState],
    *,
    now: float,
    stale_after: float,
    provider_stale_after: float,
    ejected: frozenset[str] | set[str],
    model: TTFTModel,
    fallback: dict[tuple[str, str], Fallback] | None = None,
) -> list[Candidate]:
    """Every candidate of the pool, in stable order (destination name, then
    endpoint name, then model), with ``index`` set to that order. ``fallback``
    receives each worker set's ``(Theta, T0)`` fallbacks (:func:`fallbacks`)."""
    local_dests = local_dest_index(pool)
    by_dest = local_groups(pool, endpoints)
    fb = fallbacks(by_dest, model)
    if fallback is not None:
        fallback.update(fb)
    out: list[Candidate] = []
    for key, eps in by_dest.items():
        dest = local_dests[key]
        theta_fallback, t0_fallback, peers = fb[key]
        peer_theta = dict(peers)
        for ep in eps:
            out.append(local_candidate(dest, ep, now=now, stale_after=stale_after, ejected=ejected,
                                       theta_fallback=theta_fallback, t0_fallback=t0_fallback, model=model,
                                       peer_theta=peer_theta))
    out += provider_candidates(pool, providers, now=now, provider_stale_after=provider_stale_after,
                               ejected=ejected)
    out.sort(key=lambda c: (c.dest_name, c.endpoint or "", c.model))
    for i, c in enumerate(out):
        c.index = i
    return out


def uses_fallback(ep: EndpointState) -> bool:
    """The endpoint has not learned its own Theta or T0 (its worker set's
    fallback fills in). Its peers' largest Theta (:func:`peer_thetas`)
    applies to every endpoint of a known KV capacity."""
    theta = ep.prefill_tokens_per_second
    return not (theta and theta > 0) or not _has_t0(ep)
