"""PredictedTTFT against measured TTFT (POLICY.md section 5: "checked by a
benchmark against measured TTFT, mean absolute error reported").

``python -m tests.engine.ttft_accuracy`` runs the engine simulator's
scheduler offline (``kinference_simulators.offline``: vLLM's step loop with
a token budget, sequence cap, KV blocks, prefix cache and preemption; time is
simulated, so a run is exact and instant) on Poisson workloads from light to
saturating load, with and without a shared prompt prefix, and compares, for
every request, the TTFT the simulated engine gave it with the PredictedTTFT
this engine would have predicted at its arrival from what a router sees:

- the engine's gauges at arrival (``queued`` = waiting, ``running``, KV use),
  as the collector would publish them;
- the router's own ledger: prompt tokens of every request sent and without a
  first token yet (this router is the only sender here);
- its prefix index, learned from its own sends;
- ``prefillTokensPerSecond`` and ``fixedOverheadSeconds`` as the collector
  learns them (here: the profile's prefill rate and step overhead).

It prints the mean absolute error per workload, next to a naive predictor
(the mean TTFT of the run, which knows the future) for scale.
"""

from __future__ import annotations

import bisect
import random
import statistics
import sys

from kinference_common.compiled import CompiledPolicy, CompiledPool, Destination, ServedModel
from kinference_common.engine import InFlightLedger, PrefixIndex, Snapshot
from kinference_common.engine.signals import DecisionContext
from kinference_common.engine.tokens import block_hashes
from kinference_common.messages import EndpointState


def _pool() -> CompiledPool:
    return CompiledPool(
        namespace="default", name="sim",
        destinations=[Destination(type="Local", name="ws", namespace="default",
                                  models=[ServedModel(name="m", served_name="m")])],
        aliases={"m": "m"}, policy=CompiledPolicy(namespace="default", name=""),
    )


def evaluate(profile_name: str, rate: float, prompt_tokens: int, shared_prefix: int,
             duration: float = 60.0, seed: int = 1) -> dict[str, float]:
    from kinference_simulators import offline
    from kinference_simulators.profiles import get_profile
    from kinference_simulators.scheduler import SchedulerConfig

    profile = get_profile(profile_name)
    config = SchedulerConfig(num_gpu_blocks=profile.kv_blocks, max_num_seqs=profile.max_num_seqs,
                             max_num_batched_tokens=profile.max_num_batched_tokens, max_model_len=32768)
    arrivals = offline.poisson_workload(random.Random(seed), rate=rate, duration=duration,
                                        prompt_tokens=prompt_tokens, output_tokens=128,
                                        shared_prefix_tokens=shared_prefix)
    result = offline.run(config, profile, arrivals)
    done = result.per_request
    sample_times = [s.time for s in result.samples]
    pool = _pool()
    index = PrefixIndex()
    errors, naive_base = [], []
    sent_tokens: dict[str, int] = {}  # what the router passed to ledger.sent
    mean_ttft = statistics.fmean(f.ttft for f in done if f.ttft is not None)
    for a, f in zip(sorted(arrivals, key=lambda x: x.time), done):
        if f.ttft is None:
            continue
        k = bisect.bisect_right(sample_times, a.time) - 1
        s = result.samples[max(k, 0)]
        ep = EndpointState(
            namespace="default", worker_set="ws", pod="p0", address="", ready=True, scraped_at=a.time,
            queued=s.waiting, running=s.running, kv_cache_usage=s.kv_usage,
            kv_capacity_tokens=config.num_gpu_blocks * config.block_size,
            prefill_tokens_per_second=1.0 / profile.prefill_token_s,
            fixed_overhead_seconds=profile.step_overhead_s,
        )
        snap = Snapshot(pool, [ep], now=a.time)
        # the ledger: this router's sends still without a first token, sent
        # before this arrival (so the engine's gauges already include them)
        ledger = InFlightLedger()
        for g in done:
            if g.arrival < a.time and (g.first_token is None or g.first_token > a.time):
                ledger.sent("default/ws/p0", sent_tokens[g.request_id], g.arrival)
        ledger.observed("default/ws/p0", a.time)
        hashes = block_hashes(a.prompt)
        ctx = DecisionContext(ledger.loads, f.prompt_tokens, hashes, index, snap.ttft_model)
        c = snap.candidates[0]
        predicted = ctx.predicted_ttft(c)
        sent_tokens[f.request_id] = round(f.prompt_tokens * (1 - ctx.matched_blocks(c) / len(hashes))
                                          if hashes else f.prompt_tokens)
        index.record("default/ws/p0", hashes)
        errors.append(abs(predicted - f.ttft))  # type: ignore[operator]
        naive_base.append(abs(mean_ttft - f.ttft))
    return {
        "requests": len(errors),
        "mean_ttft_ms": mean_ttft * 1e3,
        "mae_ms": statistics.fmean(errors) * 1e3,
        "naive_mae_ms": statistics.fmean(naive_base) * 1e3,
    }


WORKLOADS = [
    # (profile, rate/s, prompt tokens, shared prefix tokens)
    ("h100", 2.0, 1000, 0),
    ("h100", 10.0, 1000, 0),
    ("h100", 14.0, 1000, 0),
    ("h100", 10.0, 2000, 1500),
    ("a10g", 1.0, 500, 0),
    ("a10g", 3.0, 500, 0),
]


def main() -> int:
    print(f"{'profile':8} {'rate':>5} {'prompt':>6} {'prefix':>6} {'reqs':>5} {'mean TTFT':>10} "
          f"{'MAE':>9} {'naive MAE':>10}")
    for prof, rate, p, shared in WORKLOADS:
        r = evaluate(prof, rate, p, shared)
        print(f"{prof:8} {rate:>5} {p:>6} {shared:>6} {r['requests']:>5} {r['mean_ttft_ms']:>8.1f}ms "
              f"{r['mae_ms']:>7.1f}ms {r['naive_mae_ms']:>8.1f}ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
