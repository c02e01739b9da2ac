"""Time LiteLLM's Router picking a deployment (run by ``bench/decision.py``).

Runs inside ``bench/.venv-competitors`` (LiteLLM is never a dependency of
the product), with no Kinference import: ``python bench/litellm_pick.py
--endpoints 100 1000 --picks 5000``. Prints one JSON list of rows
``{case, endpoints, p50_us, p99_us, ...}`` on stdout.

Measured: ``Router.get_available_deployment(model=..., messages=...)``,
the synchronous pick, for the ``simple-shuffle`` and
``latency-based-routing`` strategies over ``n`` deployments of one model
group. For latency-based routing every deployment first gets latency
samples through the strategy's own success callback, so the pick ranks
real numbers (an empty cache would make it a shuffle). No request is sent.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import random
import statistics
import time
from datetime import datetime, timedelta


def build(strategy: str, n: int):  # noqa: ANN201
    from litellm import Router

    model_list = [
        {
            "model_name": "qwen-2.5",
            "litellm_params": {"model": "openai/qwen-2.5", "api_base": f"http://127.0.0.1:9/{i}/v1",
                               "api_key": "unused"},
            "model_info": {"id": f"d{i}"},
        }
        for i in range(n)
    ]
    router = Router(model_list=model_list, routing_strategy=strategy, set_verbose=False)
    if strategy == "latency-based-routing":
        rng = random.Random(n)
        logger = router.lowestlatency_logger
        now = datetime.now()
        for i in range(n):
            for _ in range(3):
                kwargs = {"litellm_params": {"metadata": {"model_group": "qwen-2.5"}, "model_info": {"id": f"d{i}"}}}
                logger.log_success_event(kwargs, None, now, now + timedelta(seconds=rng.uniform(0.05, 2.0)))
    return router


def time_picks(router, picks: int, warmup: int, budget_s: float) -> list[float]:  # noqa: ANN001
    """Up to ``picks`` timed picks, fewer when they take longer than ``budget_s`` in all (at least 100)."""
    messages = [{"role": "user", "content": "hello there"}]
    for _ in range(warmup):
        router.get_available_deployment(model="qwen-2.5", messages=messages)
    out: list[float] = []
    gc.disable()
    start = time.perf_counter()
    try:
        for i in range(picks):
            if i >= 100 and time.perf_counter() - start > budget_s:
                break
            t0 = time.perf_counter()
            router.get_available_deployment(model="qwen-2.5", messages=messages)
            out.append((time.perf_counter() - t0) * 1e6)
    finally:
        gc.enable()
    out.sort()
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--endpoints", type=int, nargs="*", default=[100, 1000])
    ap.add_argument("--picks", type=int, default=5000)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--budget", type=float, default=15.0, help="seconds of timed picks per case, at most")
    args = ap.parse_args()
    logging.disable(logging.CRITICAL)
    import litellm

    litellm.suppress_debug_info = True
    rows = []
    for strategy in ("simple-shuffle", "latency-based-routing"):
        for n in args.endpoints:
            router = build(strategy, n)
            lat = time_picks(router, args.picks, args.warmup, args.budget)
            rows.append({
                "case": f"litellm {strategy}", "endpoints": n, "rules": 0,
                "p50_us": round(lat[len(lat) // 2], 2), "p99_us": round(lat[int(len(lat) * 0.99) - 1], 2),
                "mean_us": round(statistics.fmean(lat), 2), "max_us": round(lat[-1], 2), "decisions": len(lat),
                "litellm_version": getattr(litellm, "__version__", None) or _version(),
            })
    print(json.dumps(rows))
    return 0


def _version() -> str | None:
    try:
        from importlib.metadata import version

        return version("litellm")
    except Exception:  # noqa: BLE001 - informational only
        return None


if __name__ == "__main__":
    raise SystemExit(main())
