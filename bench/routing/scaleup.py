"""A pod added to a loaded fleet: how soon does each router give it work?

``python -m bench.routing.scaleup`` runs a workload of the fleet benchmark
(:mod:`.run`) at a load sized for all of its pods, with the last pod
absent (not ready, no candidate of any router) until ``--join`` seconds,
as when an autoscaler adds a replica to a fleet that needed it. Its cache
is empty when it joins. Per router it prints how long after joining the new
pod got its first request, its share of the requests in the next 2 s and
the 8 s after (a fair share is one pod's), TTFT p50 / p99 over the 10 s
after the join and over the whole measured run, and over the 10 s after the
join the requests' end-to-end p50 / p99 and their time per output token
(p50): what the new pod's share buys the fleet's decodes. Deterministic for a seed,
like the benchmark; the rows go to ``bench/results/scaleup.json`` (``--out``).

Kinference sees the pod as the router does, through its telemetry
(``ready`` false until it joins); the peers, which read no readiness, have
it taken out of their candidates until then.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import msgspec

from . import run, workloads
from .fleet import Router, TelemetrySpec, simulate
from .kinference import Kinference

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results" / "scaleup.json"
DEFAULT_ROUTERS = ["round_robin", "gie_default", "llmd_sticky", "vllm_router_cache_aware", "kinference"]


def _absent_until(router: Router, key: str, pod: str, join: float) -> Router:
    """``router`` without ``key`` before ``join`` (sim seconds)."""
    clock = {"now": 0.0}
    pick = router.pick

    def timed_pick(req, now):  # noqa: ANN001, ANN202 - the Router interface
        clock["now"] = now
        return pick(req, now)

    router.pick = timed_pick  # type: ignore[method-assign]
    if not isinstance(router, Kinference):  # the peers: their candidate list
        cands = router.candidates  # type: ignore[attr-defined]

        def present(req):  # noqa: ANN001, ANN202
            return [k for k in cands(req) if k != key or clock["now"] >= join]

        router.candidates = present  # type: ignore[attr-defined]
    else:  # Kinference: the pod's telemetry says not ready
        on_telemetry = router.on_telemetry

        def not_ready(state, now):  # noqa: ANN001, ANN202
            if state.pod == pod and now < join:
                state = msgspec.structs.replace(state, ready=False)
            on_telemetry(state, now)

        router.on_telemetry = not_ready  # type: ignore[method-assign]
    return router


def measure(workload: str, router: str, load: float, join: float, seed: int,
            spec: run.WorkloadSpec | None = None) -> dict:
    """One row; ``spec``: the workload's fleet and duration (default: the benchmark's)."""
    spec = spec or run.SPECS[workload]
    pods = spec.pods()
    late = pods[-1]
    rate = load * run.fleet_capacity(workload, pods, seed)
    requests = workloads.generate(workload, seed, rate, spec.duration)
    r = _absent_until(run.make_router(router), late.key, late.name, join)
    res = simulate(requests, pods, [r], telemetry=TelemetrySpec(scrape_interval=0.1), seed=seed,
                   window=(spec.warmup, spec.duration))
    sent = [o for o in res.outcomes if o.target is not None]
    mine = sorted(o.req.time for o in sent if o.target == late.key)

    def share(a: float, b: float) -> float:
        n = sum(1 for o in sent if a <= o.req.time < b)
        return sum(1 for t in mine if a <= t < b) / n if n else 0.0

    def ttft(a: float, b: float) -> list[float]:
        return [o.ttft for o in res.outcomes if o.ttft is not None and a <= o.req.time < b]

    after, whole = ttft(join, join + 10), ttft(spec.warmup, spec.duration)
    done = [o for o in res.outcomes if o.e2e is not None and join <= o.req.time < join + 10]
    e2e = [o.e2e for o in done]
    tpot = [o.tpot for o in done if o.tpot is not None]
    return {
        "workload": workload, "router": router, "load": load, "join_s": join, "seed": seed, "pods": len(pods),
        "sent_before_join": sum(1 for t in mine if t < join),
        "first_request_after_s": next((round(t - join, 3) for t in mine if t >= join), None),
        "share_first_2s": round(share(join, join + 2), 3), "share_next_8s": round(share(join + 2, join + 10), 3),
        "fair_share": round(1 / len(pods), 3),
        "ttft_p50_after_s": run._q(after, 0.5), "ttft_p99_after_s": run._q(after, 0.99),
        "ttft_p50_s": run._q(whole, 0.5), "ttft_p99_s": run._q(whole, 0.99),
        "e2e_p50_after_s": run._q(e2e, 0.5), "e2e_p99_after_s": run._q(e2e, 0.99),
        "tpot_p50_after_s": run._q(tpot, 0.5),
    }


def table(rows: Sequence[dict]) -> str:
    def f(v: float | None, fmt: str = "{:.3f}") -> str:
        return "never" if v is None else fmt.format(v)

    out = ["| workload | load | router | first request (s after joining) | share, first 2 s / next 8 s (fair) "
           "| TTFT p50 / p99, 10 s after | TTFT p50 / p99, whole run | e2e p50 / p99, 10 s after | TPOT p50, 10 s after |",
           "|---|---:|---|---:|---|---|---|---|---:|"]
    for r in rows:
        out.append(f"| {r['workload']} | {r['load']} | {r['router']} | {f(r['first_request_after_s'], '{:.2f}')} "
                   f"| {r['share_first_2s']:.2f} / {r['share_next_8s']:.2f} ({r['fair_share']:.2f}) "
                   f"| {f(r['ttft_p50_after_s'])} / {f(r['ttft_p99_after_s'])} "
                   f"| {f(r['ttft_p50_s'])} / {f(r['ttft_p99_s'])} "
                   f"| {f(r.get('e2e_p50_after_s'), '{:.2f}')} / {f(r.get('e2e_p99_after_s'), '{:.2f}')} "
                   f"| {f(r.get('tpot_p50_after_s'), '{:.4f}')} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.routing.scaleup", description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", default="shared_prefix,bursty,multiturn,trial",
                    help="comma-separated workloads of the fleet benchmark (default: %(default)s)")
    ap.add_argument("--routers", default=",".join(DEFAULT_ROUTERS), help="default: %(default)s")
    ap.add_argument("--load", type=float, default=0.8, help="load, of all the pods' capacity (default: %(default)s)")
    ap.add_argument("--join", type=float, default=20.0, help="sim seconds before the last pod joins (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, default=RESULTS, help="the rows as JSON (default: %(default)s)")
    args = ap.parse_args(argv)
    bad = [w for w in args.workloads.split(",") if w not in run.SPECS]
    bad += [r for r in args.routers.split(",") if r not in run.ROUTERS]
    if bad:
        ap.error(f"unknown workload or router: {', '.join(bad)} (workloads: {', '.join(run.SPECS)}; "
                 f"routers: {', '.join(run.ROUTERS)})")
    run.pin_hash_seed("bench.routing.scaleup", argv)
    rows = [measure(w, r, args.load, args.join, args.seed)
            for w in args.workloads.split(",") for r in args.routers.split(",")]
    print(table(rows))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
