"""Lower bounds on TTFT ("floors"): what no router could go below.

A router only chooses *where* a request runs; it cannot make a pod prefill
faster than the GPU does. So for each measured request of a run:

Idle floor (a strict bound)
    The request's TTFT if it were alone on an idle pod of its model (the
    fastest GPU profile its model is served on), with every prefix it could
    share already cached: the longest prefix, in whole engine blocks, that it
    shares with any earlier request of its model (a repeated prompt, a
    group's system prompt, a conversation's previous turn), and at least the
    prefix its workload declares shareable (:attr:`SimRequest.prefix_tokens`:
    the group's system prompt, the conversation's history) even before anyone
    sent it. As the engine does (:mod:`kinference_simulators.scheduler`),
    only full blocks of the prompt minus its last token can hit, the rest is
    prefilled in chunks of at most the step's token budget
    (``max_num_batched_tokens``), each step costing
    ``step_seconds(chunk, 0, 0)``, and the first token is emitted at the end
    of the step that computes the last prompt token. Every real step of that
    request costs at least that much (other work only adds to a step, a
    cache holds no more than what was computed before), so each request's
    measured TTFT is at or above its idle floor, and therefore so is every
    quantile of them: no router can have a TTFT p99 below the idle floors'
    p99 on the same arrivals.

Loaded floor (an estimate, not a bound)
    The same, but on a pod carrying the decode work the fleet had to carry
    at that load anyway, spread perfectly evenly: each prefill step also
    carries the fleet-mean number of running decodes per pod (time-weighted
    over the measured window, idle time counting as zero, per model and GPU
    profile; see :class:`.fleet.PodLoad`) at their mean context, and loses
    their tokens from its budget; and an arrival that finds the pod busy (with
    the pods' mean busy fraction) first waits for the step in progress to end,
    a uniform residual of the mean decode step (drawn per request from a
    generator seeded by its id, so it is deterministic). This is an estimate
    of what a perfectly balanced router would see (balanced: every pod
    carries the fleet mean at every moment), not a strict bound: a router
    could do better by timing, and the step in progress can be a long prefill
    rather than a decode step. The fleet averages come from the run being
    measured, so the loaded floor differs slightly between routers of one
    case; the headline takes the lowest.

Both floors are computed over the requests whose TTFT the run measures (on
a pod, arrived after the warm-up), so they compare quantile for quantile.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kinference_simulators.profiles import SpeedProfile, get_profile

from .fleet import Outcome, PodLoad, PodSpec, RunResult, prepare
from .workloads import SimRequest


def prefill_seconds(profile: SpeedProfile, tokens: int, *, decodes: float = 0.0,
                    context_tokens: float = 0.0) -> float:
    """Seconds from a request's first step to its first token when ``tokens``
    uncached prompt tokens are computed in chunks of the step's token budget,
    each step also carrying ``decodes`` decodes (one budget token each) that
    attend to ``context_tokens`` KV tokens each."""
    if tokens <= 0:
        raise ValueError(f"a request computes at least one prompt token, got {tokens}")
    budget = max(1, profile.max_num_batched_tokens - math.ceil(decodes))
    total, left = 0.0, tokens
    while left > 0:
        chunk = min(left, budget)
        total += profile.step_seconds(chunk, decodes, decodes * context_tokens)  # type: ignore[arg-type]
        left -= chunk
    return total


def cached_tokens(requests: Sequence[SimRequest], block_size: int = 16) -> dict[str, int]:
    """Per request id, the most prompt tokens an engine could hold cached for
    it when it arrives (whole blocks; never the block holding its last token):
    the longest block prefix shared with an earlier request of the same model,
    or the workload's declared shareable prefix, whichever is longer."""
    prepare(requests, block_size)
    seen: dict[str, set[bytes]] = {}
    out: dict[str, int] = {}
    for r in sorted(requests, key=lambda r: r.time):  # stable: ties keep arrival order
        usable = (r.prompt_tokens - 1) // block_size
        hashes = r.engine_hashes[:usable]  # type: ignore[index]
        known = seen.setdefault(r.model, set())
        shared = 0
        # hashes chain (block i's covers the whole prefix), so the first miss ends the shared prefix
        while shared < len(hashes) and hashes[shared] in known:
            shared += 1
        declared = min(r.prefix_tokens // block_size, usable)
        out[r.id] = max(shared, declared) * block_size
        known.update(hashes)
    return out


@dataclass(frozen=True, slots=True)
class Carried:
    """The decode work one (model, profile) group of pods carried, per pod on average."""

    decodes: float
    context_tokens: float
    busy_fraction: float

    @classmethod
    def of(cls, loads: Iterable[PodLoad]) -> Carried:
        loads = list(loads)
        if not loads:
            return cls(0.0, 0.0, 0.0)
        seq_s = sum(x.decode_seq_seconds for x in loads)
        return cls(
            decodes=sum(x.mean_decodes for x in loads) / len(loads),
            context_tokens=sum(x.decode_context_seconds for x in loads) / seq_s if seq_s > 0 else 0.0,
            busy_fraction=sum(x.busy_fraction for x in loads) / len(loads),
        )

    def step_seconds(self, profile: SpeedProfile) -> float:
        """The mean decode step's length."""
        if self.decodes <= 0:
            return 0.0
        return profile.step_seconds(0, self.decodes, self.decodes * self.context_tokens)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class RequestFloor:
    request_id: str
    cached_tokens: int
    idle_s: float
    loaded_s: float


def _groups(pods: Sequence[PodSpec], res: RunResult | None) -> dict[str, list[tuple[SpeedProfile, Carried]]]:
    """Per model: each GPU profile serving it, with the decode work its pods carried."""
    by: dict[tuple[str, str], list[PodLoad]] = {}
    for p in pods:
        load = res.per_pod_load.get(p.key) if res is not None else None
        by.setdefault((p.model, p.profile), []).append(load if load is not None else PodLoad())
    out: dict[str, list[tuple[SpeedProfile, Carried]]] = {}
    for (model, prof), loads in sorted(by.items()):
        out.setdefault(model, []).append((get_profile(prof), Carried.of(loads)))
    return out


def request_floors(requests: Sequence[SimRequest], pods: Sequence[PodSpec],
                   res: RunResult | None = None) -> list[RequestFloor]:
    """Each request's idle floor and (with ``res``, the run's fleet averages)
    loaded floor; without ``res`` the loaded floor equals the idle floor."""
    if not pods:
        raise ValueError("floors need at least one pod")
    block = pods[0].block_size
    cached = cached_tokens(requests, block)
    groups = _groups(pods, res)
    out = []
    for r in requests:
        serving = groups.get(r.model)
        if not serving:
            raise ValueError(f"request {r.id!r}: no pod serves model {r.model!r}")
        uncached = r.prompt_tokens - cached[r.id]
        idle = min(prefill_seconds(prof, uncached) for prof, _ in serving)
        rng = random.Random(f"floor/{r.id}")
        busy_draw, residual = rng.random(), rng.random()
        loaded = min(
            (residual * c.step_seconds(prof) if busy_draw < c.busy_fraction else 0.0)
            + prefill_seconds(prof, uncached, decodes=c.decodes, context_tokens=c.context_tokens)
            for prof, c in serving
        )
        out.append(RequestFloor(r.id, cached[r.id], idle, max(idle, loaded)))
    return out


def measured_floors(res: RunResult, warmup: float) -> list[RequestFloor]:
    """The floors of the requests a run's TTFT quantiles are over: arrived
    at or after ``warmup``, answered by a pod. Sharing is judged over all of
    the run's requests (the warm-up's too: they fill caches)."""
    floors = {f.request_id: f for f in request_floors([o.req for o in res.outcomes], res.pods, res)}
    return [floors[o.req.id] for o in _measured(res.outcomes, warmup)]


def _measured(outcomes: Iterable[Outcome], warmup: float) -> list[Outcome]:
    return [o for o in outcomes if o.req.time >= warmup and o.ttft is not None and not o.provider]


def carried(res: RunResult) -> dict[str, dict[str, float]]:
    """Per model/profile, the fleet averages the loaded floor used (for the row)."""
    return {f"{m}/{prof.name}": {"decodes_per_pod": c.decodes, "decode_context_tokens": c.context_tokens,
                                 "busy_fraction": c.busy_fraction}
            for m, serving in _groups(res.pods, res).items() for prof, c in serving}
