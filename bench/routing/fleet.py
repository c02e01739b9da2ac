"""A fleet of engine simulators in simulated time, and the telemetry routers see.

Discrete events on one heap, no wall clock:

- **arrival**: a client sends a request; the router under test picks a pod
  (or a provider) with what it knows *now*;
- **step end** (per pod): the project's vLLM V1 scheduler model
  (:class:`kinference_simulators.scheduler.Scheduler`: FCFS, token budget,
  chunked prefill, prefix cache, preemption) ran one step; its tokens are
  delivered (first token: the router's ``on_first_token``; last: ``on_finished``)
  and the next step starts at once if the pod has work;
- **scrape** (per pod, every ``scrape_interval`` from a random phase): the
  engine's gauges and counters are read as a Prometheus scrape would read
  them and fed to the telemetry collector's own derivation
  (:class:`kinference_collector.derive.EndpointTracker`: queue, running, KV
  use, hit rate, learned prefill throughput and overhead);
- **delivery**: ``publish_delay`` later, the derived
  :class:`~kinference_common.messages.EndpointState` reaches every router
  (the collector's publish and the bus).

- **call**: a router's own timer (:attr:`Router.schedule`), e.g. the
  Kinference replicas' sync publishes and their delivery to the peers.

So every router decides on telemetry that is ``publish_delay`` to
``scrape_interval + publish_delay`` old, plus whatever it records of its own
sends (each router's own business: see :mod:`.peers` and :mod:`.kinference`).
A step's state changes are applied when the step is planned and its tokens
are delivered at its end; a scrape in between sees the planned batch (as a
real engine's gauges show the running batch).

Providers (for the burst measurement) answer after a fixed TTFT and stream at
a fixed rate, with unlimited capacity.

Each pod also meters, over a measurement window (default the arrival
window), how much of the time it was busy and the time-weighted number of
decodes its steps carried and their context (:class:`PodLoad`): the decode
work the fleet carried at that load, which :mod:`.floor` puts into its
loaded floor.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from kinference_collector.derive import DeriveConfig, EndpointTracker
from kinference_collector.discovery import Target
from kinference_collector.promparse import VllmSample
from kinference_common.engine.tokens import block_hashes as router_block_hashes
from kinference_common.messages import EndpointState
from kinference_simulators import tokens as sim_tokens
from kinference_simulators.profiles import SpeedProfile, get_profile
from kinference_simulators.scheduler import Scheduler, SchedulerConfig

from .workloads import SimRequest

#: sim time 0 on the clocks the engine compares (scrapedAt, staleness)
EPOCH = 1_700_000_000.0
NAMESPACE = "default"


@dataclass(frozen=True, slots=True)
class PodSpec:
    name: str
    worker_set: str
    model: str
    profile: str = "h100"
    num_gpu_blocks: int = 8192
    block_size: int = 16
    max_model_len: int = 16384

    @property
    def key(self) -> str:
        return f"{NAMESPACE}/{self.worker_set}/{self.name}"


@dataclass(frozen=True, slots=True)
class ProviderSpec:
    name: str
    ttft_s: float = 0.6
    tpot_s: float = 0.02
    #: dollars per 1M tokens (prompt + output)
    price_per_mtok: float = 1.0

    @property
    def key(self) -> str:
        return f"{NAMESPACE}/{self.name}"


@dataclass(frozen=True, slots=True)
class TelemetrySpec:
    scrape_interval: float = 0.1
    publish_delay: float = 0.02
    #: the collector's windowed signals (hit rate, Theta, T0)
    window: float = 10.0


def fleet(pods: int, *, profile: str = "h100", blocks: int = 8192, worker_sets: Sequence[tuple[str, str]] = (("ws", "m"),),
          profiles: Sequence[str] | None = None) -> list[PodSpec]:
    """``pods`` pods spread evenly over ``worker_sets`` ((name, model) pairs);
    ``profiles`` cycles GPU profiles over the pods (default: ``profile``)."""
    out = []
    for i in range(pods):
        ws, model = worker_sets[i * len(worker_sets) // pods]
        prof = profiles[i % len(profiles)] if profiles else profile
        out.append(PodSpec(f"pod-{i:02d}", ws, model, prof, blocks))
    return out


@dataclass(slots=True)
class PodLoad:
    """Seconds of one pod's steps inside the measurement window, and their
    decode work weighted by the time each step took (a step straddling the
    window's edge counts for its part inside)."""

    window_seconds: float = 0.0
    busy_seconds: float = 0.0
    #: sum over steps of decode sequences x seconds
    decode_seq_seconds: float = 0.0
    #: sum over steps of decode context tokens x seconds
    decode_context_seconds: float = 0.0

    def add(self, start: float, duration: float, decode_seqs: int, decode_context: int,
            window: tuple[float, float]) -> None:
        inside = min(start + duration, window[1]) - max(start, window[0])
        if inside <= 0:
            return
        self.busy_seconds += inside
        self.decode_seq_seconds += decode_seqs * inside
        self.decode_context_seconds += decode_context * inside

    @property
    def mean_decodes(self) -> float:
        """Decodes running on this pod, averaged over the window (idle time counts as 0)."""
        return self.decode_seq_seconds / self.window_seconds if self.window_seconds > 0 else 0.0

    @property
    def busy_fraction(self) -> float:
        return min(1.0, self.busy_seconds / self.window_seconds) if self.window_seconds > 0 else 0.0


@dataclass(eq=False, slots=True)
class Outcome:
    req: SimRequest
    target: str | None = None
    provider: bool = False
    first_token: float | None = None
    finished: float | None = None
    output_tokens: int = 0
    cached_tokens: int = 0
    preemptions: int = 0
    rejected: bool = False

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.req.time

    @property
    def e2e(self) -> float | None:
        return None if self.finished is None else self.finished - self.req.time

    @property
    def tpot(self) -> float | None:
        if self.finished is None or self.first_token is None or self.output_tokens <= 1:
            return 0.0 if self.finished is not None else None
        return (self.finished - self.first_token) / (self.output_tokens - 1)


class Pod:
    """One engine: the scheduler plus the counters vLLM's /metrics would show."""

    def __init__(self, spec: PodSpec) -> None:
        self.spec = spec
        self.profile: SpeedProfile = get_profile(spec.profile)
        cfg = SchedulerConfig(
            num_gpu_blocks=spec.num_gpu_blocks, block_size=spec.block_size,
            max_num_seqs=self.profile.max_num_seqs, max_num_batched_tokens=self.profile.max_num_batched_tokens,
            max_model_len=spec.max_model_len,
        )
        self.sched = Scheduler(cfg, self.profile)
        self.busy = False
        #: when the step in progress ends (sim seconds; meaningful while ``busy``)
        self.step_end = 0.0
        self.tracker = EndpointTracker(
            Target(address=f"{spec.name}:8000", namespace=NAMESPACE, worker_set=spec.worker_set, pod=spec.name,
                   model=spec.model), DeriveConfig(window=10.0, stale_after=5.0))
        self.tracker.set_context_window(spec.max_model_len, 0.0)
        # histogram sums vLLM exports, accumulated at first token
        self.ttft_sum = self.ttft_count = 0.0
        self.queue_sum = self.prefill_sum = 0.0
        self.kv_computed = 0.0
        self.requests = 0
        self.load = PodLoad()

    def sample(self) -> VllmSample:
        s = self.sched
        c = s.counters
        return VllmSample(
            running=float(s.num_running), waiting=float(s.num_waiting), kv_cache_usage=s.kv_usage(),
            block_size=s.config.block_size, kv_capacity_tokens=s.config.kv_capacity_tokens,
            prefix_queries=float(c.prefix_cache_queries), prefix_hits=float(c.prefix_cache_hits),
            preemptions=float(c.preemptions), prompt_tokens=float(c.prompt_tokens),
            generation_tokens=float(c.generation_tokens),
            ttft_sum=self.ttft_sum, ttft_count=self.ttft_count,
            queue_sum=self.queue_sum, queue_count=self.ttft_count,
            prefill_sum=self.prefill_sum, prefill_count=self.ttft_count,
            kv_computed_sum=self.kv_computed, kv_computed_count=self.ttft_count, series=10,
        )


class Router:
    """What the fleet asks of a router under test (see :mod:`.peers`)."""

    name = "router"
    #: ``schedule(t, fn)``: call ``fn(t)`` at sim time ``t`` (set by :func:`simulate` before ``setup``)
    schedule = None

    def setup(self, pods: Sequence[PodSpec], providers: Sequence[ProviderSpec], rng: random.Random) -> None:
        self.pods = list(pods)
        self.providers = list(providers)
        self.rng = rng

    def on_telemetry(self, state: EndpointState, now: float) -> None:
        """A scrape's derived state arrived (``now`` is sim seconds)."""

    def pick(self, req: SimRequest, now: float) -> str | None:
        """A pod key, a provider key, or None (rejected)."""
        raise NotImplementedError

    def see_fleet(self, pods: Mapping[str, Pod]) -> None:
        """The pods themselves, by key: only a reference router that is told
        everything (:mod:`.oracle`) keeps them; a router under test decides on
        telemetry and its own sends."""

    def on_first_token(self, req: SimRequest, now: float) -> None:
        pass

    def on_finished(self, req: SimRequest, now: float) -> None:
        pass


# event kinds, in tie order at one instant: tokens out, then telemetry, then arrivals
_STEP, _PROVIDER, _DELIVER, _SCRAPE, _ARRIVAL, _CALL = range(6)


@dataclass
class RunResult:
    outcomes: list[Outcome]
    pods: list[PodSpec]
    per_pod_requests: dict[str, int]
    per_pod_busy: dict[str, float]
    preemptions: int
    prefix_queries: int
    prefix_hits: int
    duration: float
    end_time: float
    provider_tokens: int = 0
    router_names: list[str] = field(default_factory=list)
    #: per pod key: busy time and decode work inside ``window``
    per_pod_load: dict[str, PodLoad] = field(default_factory=dict)
    #: the measurement window of ``per_pod_load`` (sim seconds)
    window: tuple[float, float] = (0.0, 0.0)


def prepare(requests: Sequence[SimRequest], block_size: int = 16) -> None:
    """Hash every prompt once (the engines' 16-token blocks, the routers' blocks)."""
    for r in requests:
        if r.engine_hashes is None:
            r.engine_hashes = sim_tokens.block_hashes(r.text, block_size)
        if r.router_hashes is None:
            r.router_hashes = router_block_hashes(r.text)


def simulate(
    requests: Sequence[SimRequest],
    pods: Sequence[PodSpec],
    routers: Sequence[Router],
    *,
    telemetry: TelemetrySpec = TelemetrySpec(),
    providers: Sequence[ProviderSpec] = (),
    seed: int = 0,
    duration: float | None = None,
    assign: str = "round_robin",
    window: tuple[float, float] | None = None,
    phase: int = 0,
) -> RunResult:
    """Run ``requests`` through ``pods``; with several ``routers`` (replicas
    of one router), arrivals are spread over them (``assign``:
    ``round_robin`` or ``random``, as a Service's load balancing would).
    Runs until every request has finished. ``window`` (sim seconds; default
    from 0 to the horizon) is where the pods' :class:`PodLoad` is metered.
    ``phase`` picks another draw of when each pod's scrapes fall within
    the interval (0: the benchmark's; the arrivals, the pods and the
    routers' own draws stay the same): a real fleet's scrapes fall at no
    particular instant, and a result that moves with them is that
    instant's, not the router's (``make bench-routing-band``)."""
    rng = random.Random(f"fleet/{seed}" if not phase else f"fleet/{seed}/phase/{phase}")
    prepare(requests, pods[0].block_size if pods else 16)
    fleet_pods = {p.key: Pod(p) for p in pods}
    prov = {p.key: p for p in providers}
    outcomes = {r.id: Outcome(r) for r in requests}
    owner: dict[str, Router] = {}
    heap: list[tuple[float, int, int, object]] = []
    seq = 0

    def push(t: float, kind: int, payload: object) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(heap, (t, kind, seq, payload))

    for i, r in enumerate(routers):
        r.schedule = lambda t, fn: push(t, _CALL, fn)
        r.setup(pods, providers, random.Random(f"router/{seed}/{i}"))
        r.see_fleet(fleet_pods)

    for r in requests:
        push(r.time, _ARRIVAL, r)
    end_arrivals = max((r.time for r in requests), default=0.0)
    horizon = duration if duration is not None else end_arrivals
    win = window if window is not None else (0.0, horizon)
    for pod in fleet_pods.values():
        pod.load.window_seconds = max(0.0, win[1] - win[0])
    for key, pod in fleet_pods.items():
        # routers start with every pod's idle state (a router that starts up
        # reads the last published telemetry before it serves)
        pod.tracker.observe(pod.sample(), EPOCH)
        push(0.0, _DELIVER, pod.tracker.state(EPOCH))
        push(rng.uniform(0, telemetry.scrape_interval), _SCRAPE, key)

    def start_step(pod: Pod, now: float) -> None:
        result = pod.sched.step(now)
        pod.busy = True
        pod.step_end = result.end
        pod.load.add(result.start, result.duration, result.decode_seqs, result.decode_context_tokens, win)
        push(result.end, _STEP, (pod, result))

    n_left = len(requests)
    rr = 0
    provider_tokens = 0
    while heap and n_left > 0:
        now, kind, _, payload = heapq.heappop(heap)
        if kind == _ARRIVAL:
            req = payload  # type: ignore[assignment]
            if len(routers) == 1:
                router = routers[0]
            elif assign == "random":
                router = routers[rng.randrange(len(routers))]
            else:
                router = routers[rr % len(routers)]
                rr += 1
            target = router.pick(req, now)
            out = outcomes[req.id]
            out.target = target
            if target is None:
                out.rejected = True
                n_left -= 1
                continue
            owner[req.id] = router
            if target in prov:
                p = prov[target]
                out.provider = True
                push(now + p.ttft_s, _PROVIDER, (req, 0))
                continue
            pod = fleet_pods[target]
            pod.requests += 1
            pod.sched.add_request(req.id, req.prompt_tokens, req.engine_hashes, req.output_len, "length", now)
            if not pod.busy:
                start_step(pod, now)
        elif kind == _STEP:
            pod, result = payload  # type: ignore[misc]
            pod.busy = False
            for ev in result.tokens:
                out = outcomes[ev.request_id]
                out.output_tokens = ev.index + 1
                if ev.index == 0:
                    out.first_token = ev.time
                    sr = pod.sched._by_id.get(ev.request_id)
                    if sr is not None:
                        _record_first(pod, sr, ev.time)
                    owner[ev.request_id].on_first_token(out.req, ev.time)
            for f in result.finished:
                out = outcomes[f.request_id]
                out.finished = f.finished
                out.cached_tokens = f.cached_tokens
                out.preemptions = f.preemptions
                if f.output_tokens == 1:
                    _record_first_finished(pod, f)
                owner.pop(f.request_id).on_finished(out.req, f.finished)
                n_left -= 1
            if pod.sched.has_work():
                start_step(pod, now)
        elif kind == _PROVIDER:
            req, _ = payload  # type: ignore[misc]
            p = prov[outcomes[req.id].target]  # type: ignore[index]
            out = outcomes[req.id]
            out.first_token = now
            owner[req.id].on_first_token(req, now)
            out.output_tokens = req.output_len
            out.finished = now + p.tpot_s * max(0, req.output_len - 1)
            provider_tokens += req.prompt_tokens + req.output_len
            owner.pop(req.id).on_finished(req, out.finished)
            n_left -= 1
        elif kind == _SCRAPE:
            key = payload  # type: ignore[assignment]
            pod = fleet_pods[key]
            wall = EPOCH + now
            pod.tracker.observe(pod.sample(), wall)
            state = pod.tracker.state(wall)
            push(now + telemetry.publish_delay, _DELIVER, state)
            push(now + telemetry.scrape_interval, _SCRAPE, key)
        elif kind == _CALL:
            payload(now)  # type: ignore[operator]
        else:  # _DELIVER
            for router in routers:
                router.on_telemetry(payload, now)  # type: ignore[arg-type]
    end = now if heap else 0.0
    total_pre = sum(p.sched.counters.preemptions for p in fleet_pods.values())
    return RunResult(
        outcomes=[outcomes[r.id] for r in requests],
        pods=list(pods),
        per_pod_requests={k: p.requests for k, p in fleet_pods.items()},
        per_pod_busy={k: p.sched.counters.busy_seconds for k, p in fleet_pods.items()},
        preemptions=total_pre,
        prefix_queries=sum(p.sched.counters.prefix_cache_queries for p in fleet_pods.values()),
        prefix_hits=sum(p.sched.counters.prefix_cache_hits for p in fleet_pods.values()),
        duration=horizon,
        end_time=end,
        provider_tokens=provider_tokens,
        router_names=[r.name for r in routers],
        per_pod_load={k: p.load for k, p in fleet_pods.items()},
        window=win,
    )


def _record_first(pod: Pod, sr, t: float) -> None:  # noqa: ANN001 - a scheduler SimRequest
    """vLLM's TTFT / queue / prefill histograms and computed prompt tokens."""
    pod.ttft_sum += t - sr.arrival
    pod.ttft_count += 1
    first = sr.first_scheduled if sr.first_scheduled is not None else t
    pod.queue_sum += first - sr.arrival
    pod.prefill_sum += t - first
    pod.kv_computed += sr.prompt_tokens - max(sr.num_cached_tokens, 0)


def _record_first_finished(pod: Pod, f) -> None:  # noqa: ANN001 - a FinishedRequest
    """A one-token request is gone from the scheduler by the time its token is seen."""
    if f.first_token is None:
        return
    pod.ttft_sum += f.first_token - f.arrival
    pod.ttft_count += 1
    pod.queue_sum += f.first_scheduled - f.arrival
    pod.prefill_sum += f.first_token - f.first_scheduled
    pod.kv_computed += f.prompt_tokens - f.cached_tokens
