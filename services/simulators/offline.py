"""Run the scheduler offline: arrivals in, per-request results and a timeline out.

Time is simulated only (step durations are added up), so a run is exact and
instantaneous: what tests and the shape plot use.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from . import tokens
from .profiles import SpeedProfile
from .scheduler import FinishedRequest, Scheduler, SchedulerConfig


@dataclass(frozen=True, slots=True)
class Arrival:
    time: float
    prompt: str
    output_len: int
    request_id: str = ""


@dataclass(frozen=True, slots=True)
class Sample:
    """Engine state at the start of a step."""

    time: float
    waiting: int
    running: int
    kv_usage: float
    queued_prefill_tokens: int


@dataclass
class RunResult:
    finished: dict[str, FinishedRequest]
    samples: list[Sample]
    #: queued prefill tokens (waiting + running) seen by each request at arrival
    queued_at_arrival: dict[str, int]
    preemptions: int
    prefix_cache_queries: int
    prefix_cache_hits: int
    end_time: float
    busy_seconds: float
    per_request: list[FinishedRequest] = field(default_factory=list)

    def ttfts(self) -> list[float]:
        return [f.ttft for f in self.per_request if f.ttft is not None]

    def mean_ttft(self) -> float:
        t = self.ttfts()
        return sum(t) / len(t)

    def mean_kv_usage(self) -> float:
        return sum(s.kv_usage for s in self.samples) / max(1, len(self.samples))

    def max_kv_usage(self) -> float:
        return max((s.kv_usage for s in self.samples), default=0.0)

    @property
    def hit_rate(self) -> float:
        return self.prefix_cache_hits / max(1, self.prefix_cache_queries)


def run(
    config: SchedulerConfig,
    profile: SpeedProfile,
    arrivals: Iterable[Arrival],
    *,
    until: float | None = None,
) -> RunResult:
    sched = Scheduler(config, profile)
    pending = sorted(arrivals, key=lambda a: a.time)
    ids = [a.request_id or f"r{i}" for i, a in enumerate(pending)]
    finished: dict[str, FinishedRequest] = {}
    samples: list[Sample] = []
    queued_at: dict[str, int] = {}
    now = 0.0
    i = 0
    while i < len(pending) or sched.has_work():
        if not sched.has_work() and i < len(pending):
            now = max(now, pending[i].time)
        while i < len(pending) and pending[i].time <= now:
            a = pending[i]
            queued_at[ids[i]] = sched.queued_prefill_tokens()
            sched.add_request(
                ids[i],
                tokens.count_tokens(a.prompt),
                tokens.block_hashes(a.prompt, config.block_size),
                a.output_len,
                "length",
                a.time,
            )
            i += 1
        samples.append(
            Sample(
                now,
                sched.num_waiting,
                sched.num_running,
                sched.kv_usage(),
                sched.queued_prefill_tokens(),
            )
        )
        result = sched.step(now)
        for f in result.finished:
            finished[f.request_id] = f
        now = result.end
        if until is not None and now > until:
            break
    return RunResult(
        finished=finished,
        samples=samples,
        queued_at_arrival=queued_at,
        preemptions=sched.counters.preemptions,
        prefix_cache_queries=sched.counters.prefix_cache_queries,
        prefix_cache_hits=sched.counters.prefix_cache_hits,
        end_time=now,
        busy_seconds=sched.counters.busy_seconds,
        per_request=[finished[r] for r in ids if r in finished],
    )


# ------------------------------------------------------------- workloads


def random_text(rng: random.Random, n_tokens: int) -> str:
    """Text of exactly ``n_tokens`` tokens (4 characters each), unique with high probability."""
    alphabet = "abcdefghijklmnopqrstuvwxyz     "
    return "".join(rng.choices(alphabet, k=n_tokens * tokens.CHARS_PER_TOKEN))


def poisson_workload(
    rng: random.Random,
    *,
    rate: float,
    duration: float,
    prompt_tokens: int,
    output_tokens: int,
    shared_prefix_tokens: int = 0,
    prefix_text: str | None = None,
) -> list[Arrival]:
    """Poisson arrivals at ``rate``/s for ``duration`` s; prompts optionally share a prefix."""
    prefix = ""
    if shared_prefix_tokens:
        prefix = (
            prefix_text
            if prefix_text is not None
            else random_text(random.Random(f"prefix/{shared_prefix_tokens}"), shared_prefix_tokens)
        )
    times: list[float] = []
    t = rng.expovariate(rate)
    while t < duration:
        times.append(t)
        t += rng.expovariate(rate)
    # texts after times: the same seed and rate give the same arrival times
    # whatever the prompts look like
    return [
        Arrival(t, prefix + random_text(rng, prompt_tokens - shared_prefix_tokens), output_tokens)
        for t in times
    ]


def burst(prompts: Sequence[str], output_len: int, at: float = 0.0) -> list[Arrival]:
    return [Arrival(at, p, output_len, f"b{i}") for i, p in enumerate(prompts)]
