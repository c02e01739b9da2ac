"""Decision-engine latency: ``make bench-decision`` (``python -m bench.decision``).

Measures :func:`kinference_common.engine.decide` in-process, decision only
(no body parsing, no trace rendering), for 16, 100 and 1,000 endpoints with
1 and 20 rules, over ``--decisions`` decisions per case after a warm-up, and
a trivial baseline timed the same way (a bare function call) so the figures
can be read as ratios on whatever machine runs them. Prints a table and
writes ``bench/results/decision.json``: ``[{case, endpoints, rules, p50_us,
p99_us, ...}]``.

The workload is the seed burst policy (exclusions on queuedPrompts and
kvCacheUsage, a tag-conditional provider drop, a Local PredictedTTFT tier and
a Provider tier) with every endpoint serving the requested model (the worst
case: every endpoint is a candidate), a ledger with requests in flight on a
tenth of the endpoints, a populated prefix index, and requests with varied
tenants, tags and prompt sizes. With 20 rules, 19 rules whose ``matches``
do not hold (tenants, headers, objectives) come first.

Targets (issue 3): p99 < 100 us at 100 endpoints, < 1 ms at 1,000.

The same run also times LiteLLM's Router picking a deployment
(``simple-shuffle`` and ``latency-based-routing``, 100 and 1,000
deployments; :mod:`bench.litellm_pick`, run in ``bench/.venv-competitors``
so LiteLLM never becomes a product dependency; ``--no-litellm`` skips it)
and prints Kinference's p99 against a tenth of latency-based routing's at
each size (issue 11's target). Rows ``{case, endpoints, p50_us, p99_us}``.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
import time
from pathlib import Path

from kinference_common.compiled import (
    CandidateTest,
    CompiledExclusion,
    CompiledPolicy,
    CompiledPool,
    CompiledRule,
    CompiledTier,
    Destination,
    Header,
    PoolModel,
    ProviderSettings,
    Range,
    RequestTest,
    SecretRef,
    ServedModel,
    SignalTest,
)
from kinference_common.engine import InFlightLedger, PrefixIndex, Request, Snapshot, decide
from kinference_common.engine.tokens import block_hashes
from kinference_common.messages import EndpointState, ProviderState

RESULTS = Path(__file__).resolve().parent / "results" / "decision.json"
NOW = 1_700_000_000.0
WORKER_SETS = 4


def burst_rule(index: int) -> CompiledRule:
    return CompiledRule(
        name="local-first-then-provider-unless-pii", index=index, term=f"rules[{index}]",
        exclude=[
            CompiledExclusion(name="big-queues", term="x0", live=True, drop=CandidateTest(
                backend_type="Local",
                signals=[SignalTest(signal="queuedPrompts", range=Range(greater_than=4))])),
            CompiledExclusion(name="no-kv-headroom", term="x1", live=True, drop=CandidateTest(
                backend_type="Local",
                signals=[SignalTest(signal="kvCacheUsage", range=Range(greater_than=0.9))])),
            CompiledExclusion(name="pii-stays", term="x2", when=RequestTest(tags=["pii-confirmed", "pii-unknown"]),
                              drop=CandidateTest(backend_type="Provider")),
        ],
        select=[CompiledTier(index=0, term="s0", type="Local", minimize="PredictedTTFT"),
                CompiledTier(index=1, term="s1", type="Provider", order=["databricks"])],
        tie_break=["LeastInFlight"],
        requires_classifiers=["pii"],
    )


def decoy_rule(i: int) -> CompiledRule:
    """A rule that does not match the benchmark's requests."""
    kind = i % 3
    matches = [
        [RequestTest(tenants=[f"team-{i}", f"team-{i}-b"])],
        [RequestTest(headers=[Header(name="x-route", value=f"lane-{i}")])],
        [RequestTest(objectives=[f"objective-{i}"]), RequestTest(models=["other-model"])],
    ][kind]
    return CompiledRule(
        name=f"decoy-{i}", index=i, term=f"rules[{i}]", matches=matches,
        exclude=[CompiledExclusion(name=f"d{i}", term="x", live=True, drop=CandidateTest(
            backend_type="Local", signals=[SignalTest(signal="runningPrompts", range=Range(greater_than=80))]))],
        select=[CompiledTier(index=0, term="s0", type="Local", minimize="QueuedPrompts")],
        on_empty="FallThrough",
    )


def build_world(endpoints: int, rules: int, rng: random.Random):
    dests = [
        Destination(type="Local", name=f"qwen-{w}", namespace="default",
                    models=[ServedModel(name="qwen-2.5", served_name="Qwen/Qwen2.5-32B-Instruct",
                                        context_window=32768)])
        for w in range(WORKER_SETS)
    ]
    dests.append(Destination(
        type="Provider", name="databricks", namespace="default",
        models=[ServedModel(name="qwen-2.5", served_name="databricks-qwen25")],
        provider=ProviderSettings(url="https://x", secret_ref=SecretRef(name="s", key="k"))))
    policy_rules = [decoy_rule(i) for i in range(rules - 1)] + [burst_rule(rules - 1)]
    pool = CompiledPool(
        namespace="default", name="bench", revision="r", destinations=dests,
        models=[PoolModel(name="qwen-2.5", served_by=[d.name for d in dests])],
        aliases={"qwen-2.5": "qwen-2.5", "Qwen/Qwen2.5-32B-Instruct": "qwen-2.5"},
        policy=CompiledPolicy(namespace="default", name="bench", rules=policy_rules),
    )
    states = [
        EndpointState(
            namespace="default", worker_set=f"qwen-{i % WORKER_SETS}", pod=f"pod-{i}", address="10.0.0.1:8000",
            model="qwen-2.5", ready=rng.random() > 0.02, scraped_at=NOW - rng.uniform(0, 2),
            queued=rng.randint(0, 8), running=rng.randint(0, 120), kv_cache_usage=rng.random(),
            kv_capacity_tokens=400_000, prefix_cache_hit_rate=rng.random() * 0.5,
            prefill_tokens_per_second=rng.uniform(6000, 14000), fixed_overhead_seconds=0.02,
        )
        for i in range(endpoints)
    ]
    providers = [ProviderState(namespace="default", name="databricks", estimated_ttft_seconds=0.8,
                               error_rate=0.01, updated_at=NOW)]
    snapshot = Snapshot(pool, states, providers, now=NOW, rng=random.Random(1))

    ledger = InFlightLedger()
    for c in rng.sample(snapshot.candidates, max(1, endpoints // 10)):
        for _ in range(rng.randint(1, 4)):
            ledger.sent(c.ledger_key, rng.randint(100, 4000), NOW + rng.uniform(-1, 1))

    prefix = PrefixIndex()
    systems = [f"System prompt {k}: you are a careful assistant for team {k}. " * 40 for k in range(8)]
    local = [c for c in snapshot.candidates if c.is_local]
    for _ in range(endpoints * 4):
        prefix.record(rng.choice(local).ledger_key, block_hashes(rng.choice(systems) + rng.choice("abcdef") * 300))

    requests = []
    for k in range(64):
        text = rng.choice(systems) + f"question {k} " * rng.randint(5, 200)
        requests.append(Request(
            model=rng.choice(["qwen-2.5", "Qwen/Qwen2.5-32B-Instruct"]),
            tenant=rng.choice(["alice", "bob", "carol"]),
            tags=frozenset([rng.choice(["pii-none", "pii-none", "pii-unknown", "pii-confirmed"])]),
            prompt_tokens=rng.randint(50, 6000), max_tokens=rng.choice([None, 256, 1024]),
            headers={"x-route": "main"}, block_hashes=block_hashes(text),
        ))
    return snapshot, ledger, prefix, requests


def percentile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def time_calls(fn, args_list, n: int, warmup: int) -> list[float]:
    """Per-call latency in microseconds, each call timed on its own."""
    clock = time.perf_counter_ns
    m = len(args_list)
    for i in range(warmup):
        fn(*args_list[i % m])
    gc.collect()
    out = [0.0] * n
    for i in range(n):
        a = args_list[i % m]
        t0 = clock()
        fn(*a)
        out[i] = (clock() - t0) / 1000.0
    out.sort()
    return out


def run_case(endpoints: int, rules: int, n: int, warmup: int) -> dict:
    rng = random.Random(endpoints * 100 + rules)
    snapshot, ledger, prefix, requests = build_world(endpoints, rules, rng)

    def one(request: Request) -> None:
        decide(snapshot, request, ledger=ledger, prefix=prefix)

    t0 = time.perf_counter()
    build = Snapshot(snapshot.pool, [c.state for c in snapshot.candidates if c.is_local],  # type: ignore[misc]
                     [c.state for c in snapshot.candidates if not c.is_local and c.state], now=NOW)
    build_ms = (time.perf_counter() - t0) * 1e3
    del build
    lat = time_calls(one, [(r,) for r in requests], n, warmup)
    routed = sum(decide(snapshot, r, ledger=ledger, prefix=prefix).routed for r in requests)
    return {
        "case": "decide", "endpoints": endpoints, "rules": rules,
        "p50_us": round(percentile(lat, 0.50), 2), "p99_us": round(percentile(lat, 0.99), 2),
        "mean_us": round(statistics.fmean(lat), 2), "max_us": round(lat[-1], 2),
        "decisions": n, "routed_share": round(routed / len(requests), 2),
        "snapshot_build_ms": round(build_ms, 2),
    }


def baseline(n: int, warmup: int) -> dict:
    table = {f"k{i}": i for i in range(1000)}

    def bare(key: str) -> int:
        return table[key]

    lat = time_calls(bare, [(f"k{i}",) for i in range(64)], n, warmup)
    return {"case": "baseline: a function call doing one dict lookup", "endpoints": 0, "rules": 0,
            "p50_us": round(percentile(lat, 0.50), 3), "p99_us": round(percentile(lat, 0.99), 3),
            "mean_us": round(statistics.fmean(lat), 3), "max_us": round(lat[-1], 2), "decisions": n}


def litellm_rows() -> list[dict]:
    """LiteLLM's pick latency, timed in the competitors' virtualenv; [] with a note when unavailable."""
    import subprocess

    from bench.router import COMPETITORS, ensure_competitors

    why = ensure_competitors()
    if why is not None:
        print(f"LiteLLM not timed: {why}", file=sys.stderr)
        return []
    script = Path(__file__).resolve().parent / "litellm_pick.py"
    try:
        out = subprocess.run([str(COMPETITORS / "bin" / "python"), str(script), "--endpoints", "100", "1000"],
                             check=True, capture_output=True, text=True, timeout=900).stdout
        return json.loads(out.strip().splitlines()[-1])
    except (subprocess.SubprocessError, OSError, ValueError, IndexError) as exc:
        print(f"LiteLLM not timed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return []


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.decision", description=__doc__.split("\n\n")[0])
    ap.add_argument("--decisions", type=int, default=20_000, help="timed decisions per case (default 20000)")
    ap.add_argument("--warmup", type=int, default=2_000)
    ap.add_argument("--endpoints", type=int, nargs="*", default=[16, 100, 1000])
    ap.add_argument("--rules", type=int, nargs="*", default=[1, 20])
    ap.add_argument("--no-write", action="store_true", help="print only")
    ap.add_argument("--no-litellm", action="store_true", help="skip timing LiteLLM's Router")
    args = ap.parse_args(argv)

    rows = [baseline(args.decisions, args.warmup)]
    for e in args.endpoints:
        for r in args.rules:
            rows.append(run_case(e, r, args.decisions, args.warmup))
    if not args.no_litellm:
        rows.extend(litellm_rows())
    base = rows[0]["p50_us"] or 1e-3
    print(f"{'endpoints':>9} {'rules':>5} {'p50 us':>9} {'p99 us':>9} {'p50/base':>9} {'routed':>7} "
          f"{'build ms':>9}  case")
    for row in rows:
        print(f"{row['endpoints']:>9} {row['rules']:>5} {row['p50_us']:>9.2f} {row['p99_us']:>9.2f} "
              f"{row['p50_us'] / base:>9.0f} {row.get('routed_share', ''):>7} "
              f"{row.get('snapshot_build_ms', ''):>9}  {row['case']}")
    targets = {100: 100.0, 1000: 1000.0}
    for row in rows[1:]:
        if row["case"] != "decide":
            continue
        limit = targets.get(row["endpoints"])
        if limit is not None:
            verdict = "meets" if row["p99_us"] < limit else "MISSES"
            print(f"  {row['endpoints']} endpoints, {row['rules']} rules: p99 {row['p99_us']:.1f} us "
                  f"{verdict} the {limit:.0f} us target")
    for n in (100, 1000):
        lite = next((r for r in rows if r["case"] == "litellm latency-based-routing" and r["endpoints"] == n), None)
        ours = [r for r in rows if r["case"] == "decide" and r["endpoints"] == n]
        if lite and ours:
            worst = max(r["p99_us"] for r in ours)
            verdict = "meets" if worst < lite["p99_us"] / 10 else "MISSES"
            print(f"  {n} endpoints: Kinference p99 {worst:.1f} us (worst over rule counts) vs LiteLLM "
                  f"latency-based p99 {lite['p99_us']:.1f} us: x{lite['p99_us'] / worst:.0f}; {verdict} "
                  f"the < 1/10 target")
    if not args.no_write:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(rows, indent=2) + "\n")
        print(f"wrote {RESULTS.relative_to(Path.cwd()) if RESULTS.is_relative_to(Path.cwd()) else RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
