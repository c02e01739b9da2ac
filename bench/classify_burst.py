"""The classifier service under a burst, alone: ``python -m bench.classify_burst``.

What pays when N classify requests (short prompts, 180 clean and 20 with a
card number, like the saturation trial) are made at the same moment:

- ``single``: one NATS request per prompt (``classify_client.classify_body``);
- ``batch``: the router's :class:`kinference_router.classification.Batcher`
  (one message per event-loop turn, up to 32 items);
- each with 1 or 2 replicas of ``python -m kinference_classifier`` in the
  queue group;
- ``in-process``: the detectors in this process (the router's InProcess path).

No router, no HTTP: this isolates the classifier path from the router's own
load. Reported per mode: answered within the 20 ms deadline, the time until
the last answer, p50/p99 of the per-request round trip, and the CPU the
caller spent (``time.process_time``). Prints a table, writes
``bench/results/classify_burst.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results" / "classify_burst.json"


def bodies(n: int) -> list[dict[str, Any]]:
    from bench.burst import clean_prompt, pii_prompt

    return [{"model": "m", "messages": [{"role": "user",
                                          "content": pii_prompt(i) if i % 10 == 3 else clean_prompt(i)}]}
            for i in range(n)]


async def burst(mode: str, nc: Any, items: list[dict[str, Any]]) -> dict[str, Any]:
    from kinference_common.classify_client import classify_body
    from kinference_router.classification import Batcher

    batcher = Batcher(lambda: nc)
    if mode == "in-process":
        from kinference_common.detectors.core import Classifiers
        from kinference_common.prompt_texts import texts_from_body

        detectors = Classifiers()
        detectors.warm_up()

    async def one(body: dict[str, Any]) -> tuple[str, float]:
        t0 = time.perf_counter()
        if mode == "single":
            reply = await classify_body(nc, "pii", body, 0.020)
        elif mode == "batch":
            reply = await batcher.classify("pii", body, "")
        else:
            ex = texts_from_body(body)
            reply = detectors.classify("pii", ex.texts, roles=ex.roles, deadline_ms=5.0)
        return reply.outcome, time.perf_counter() - t0

    cpu0, t0 = time.process_time(), time.perf_counter()
    results = await asyncio.gather(*(one(b) for b in items))
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    lat = sorted(s for _, s in results)
    return {"ok": sum(o == "ok" for o, _ in results), "n": len(results), "last_ms": round(wall * 1e3, 2),
            "p50_ms": round(statistics.median(lat) * 1e3, 2), "p99_ms": round(lat[int(0.99 * (len(lat) - 1))] * 1e3, 2),
            "caller_cpu_us_per_request": round(cpu / len(results) * 1e6, 1)}


async def amain(args: argparse.Namespace) -> int:
    import nats

    from kinference_common import natsserver
    from kinference_common.classify_client import classify

    items = bodies(args.requests)
    rows = []
    with natsserver.start() as server:
        procs: list[subprocess.Popen[bytes]] = []
        nc = await nats.connect(server.url)
        try:
            for replicas in (1, 2):
                while len(procs) < replicas:
                    procs.append(subprocess.Popen(
                        [sys.executable, "-m", "kinference_classifier", "--nats-url", server.url, "--health-port",
                         "0", "--log-level", "warning", "--classifier", "pii"],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ}))
                    await asyncio.sleep(1.5)
                for _ in range(100):
                    if (await classify(nc, "pii", ["hi"], 1.0)).outcome == "ok":
                        break
                    await asyncio.sleep(0.1)
                for mode in ("single", "batch"):
                    for r in range(args.rounds):
                        await burst(mode, nc, items[:20])  # warm
                        row = {"mode": mode, "replicas": replicas, "round": r + 1,
                               **await burst(mode, nc, items)}
                        rows.append(row)
                        print(json.dumps(row), flush=True)
                        await asyncio.sleep(0.3)
            for r in range(args.rounds):
                row = {"mode": "in-process", "replicas": 0, "round": r + 1, **await burst("in-process", nc, items)}
                rows.append(row)
                print(json.dumps(row), flush=True)
        finally:
            await nc.close()
            for p in procs:
                p.terminate()
                p.wait(timeout=20)
    print("| mode | replicas | in time (median of rounds) | last answer ms | p50 ms | p99 ms | caller CPU us/request |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for mode, replicas in (("single", 1), ("single", 2), ("batch", 1), ("batch", 2), ("in-process", 0)):
        rs = [r for r in rows if r["mode"] == mode and r["replicas"] == replicas]
        med = lambda k: statistics.median(r[k] for r in rs)  # noqa: E731
        print(f"| {mode} | {replicas or '-'} | {med('ok'):.0f}/{rs[0]['n']} | {med('last_ms')} | {med('p50_ms')} | "
              f"{med('p99_ms')} | {med('caller_cpu_us_per_request')} |")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(rows, indent=2))
    print(f"wrote {RESULTS}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.classify_burst", description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--rounds", type=int, default=5)
    return asyncio.run(amain(p.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
