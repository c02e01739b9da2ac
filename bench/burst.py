"""The saturation trial: ``make load-burst`` (``python -m bench.burst``).

The stack ``make run`` starts (nats-server, policy-compiler on the example
burst-unless-PII policy, classifier service, three vLLM simulators, DCGM and
provider simulators, collector, router), then ``--clean`` + ``--pii``
streaming chat completions (180 + 20) sent together: the clean ones are
distinct prose, each PII one carries a card number and an e-mail address.

Reported (a table, and ``bench/results/burst.json``):

- where each request went (``x-kinference-backend``) or its status: clean
  prompts that burst to the provider, stayed local, were refused (503
  ``no_capacity``, 429 ``rate_limited``); PII prompts likewise;
- what the provider simulator logged (its own log, not the router's view):
  how many requests, and how many carried PII (must be 0);
- the router's classifier outcomes from ``/metrics``: answered in time,
  deadline misses, shed, skipped (lazy), and the round trip's mean.

Runs against whatever code this interpreter imports (so the same file
measures an older checkout: copy it into that checkout's ``bench/``).
``--rounds N`` repeats the trial on fresh stacks.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

RESULTS = Path(__file__).resolve().parent / "results" / "burst.json"

CARD = "4111 1111 1111 1111"
EMAIL = "jane.doe@example.com"
#: free-text personal data only (no shaped identifier): a name, a street address, a birth date
NAME, STREET = "Maria Gonzalez", "14 Rue des Lilas"
#: what only a PII prompt carries (shorter markers match timestamps and ids in the log)
PII_MARKERS = (CARD, EMAIL, NAME, STREET)
TOPICS = ["tea", "bridges", "volcanoes", "chess", "the printing press", "bees", "glaciers", "jazz", "sailing",
          "bread", "comets", "railways", "maps", "paper", "clocks", "coffee", "owls", "deserts"]


def clean_prompt(i: int) -> str:
    return (f"Request {i}: write three sentences about the history of {TOPICS[i % len(TOPICS)]}, "
            f"then list {i % 7 + 2} facts about it in plain prose.")


def pii_prompt(i: int) -> str:
    """Most carry a card and an e-mail; one in four (``i % 4 == 1``) only a name, a street
    address and a birth date, which the classifier's free-text rules must keep local."""
    if i % 4 == 1:
        return (f"Request {i}: Hi, I'm {NAME}, {STREET}, 69001 Lyon, born 03/07/1985, "
                "and my claim was refused; please draft an appeal.")
    return (f"Request {i}: my card is {CARD} and my email is {EMAIL}; "
            "please summarise my last statement.")


async def one(http: aiohttp.ClientSession, url: str, content: str, max_tokens: int) -> tuple[int, str]:
    body = {"model": "qwen-2.5", "stream": True, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": content}]}
    try:
        async with http.post(url, json=body) as r:
            backend = r.headers.get("x-kinference-backend", "")
            async for _ in r.content.iter_any():
                pass
            return r.status, backend
    except Exception as exc:  # counted as an error, never raised
        return -1, type(exc).__name__


def parse_metrics(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, _, value = line.rpartition(" ")
        try:
            out[name] = float(value)
        except ValueError:
            pass
    return out


def classifier_counts(metrics: dict[str, float]) -> dict[str, float]:
    counts: dict[str, float] = {}
    total_s = n = 0.0
    for k, v in metrics.items():
        m = re.match(r'kinference_classifier_seconds_count\{classifier="pii",outcome="(\w+)"\}', k)
        if m:
            counts[m.group(1)] = counts.get(m.group(1), 0) + v
            n += v
        if k.startswith('kinference_classifier_seconds_sum{classifier="pii"'):
            total_s += v
        if k.startswith('kinference_classifier_skipped_total{classifier="pii"'):
            counts["skipped"] = v
        if k.startswith('kinference_classifier_shed_total{classifier="pii"'):
            counts["shed"] = counts.get("shed", 0) + 0  # shed is also an outcome of _seconds
    counts["mean_ms"] = round(total_s / n * 1e3, 2) if n else 0.0
    return counts


async def wait_for_telemetry(http: aiohttp.ClientSession, admin: str) -> None:
    for _ in range(150):
        try:
            async with http.post(f"{admin}/debug/explain",
                                 json={"model": "qwen-2.5", "messages": [{"role": "user", "content": "x"}],
                                       "tags": ["pii-none"]}) as r:
                trace = await r.json()
            if trace["outcome"]["type"] == "Routed" and trace["outcome"]["backend"].startswith("Local/"):
                return
        except (aiohttp.ClientError, KeyError, json.JSONDecodeError):
            pass
        await asyncio.sleep(0.2)
    raise RuntimeError("the router never saw endpoint telemetry")


async def trial(stack: Any, n_clean: int, n_pii: int, max_tokens: int) -> dict[str, Any]:
    """Send the burst to a started stack; return the counts."""
    url = f"http://127.0.0.1:{stack.port(8080)}/v1/chat/completions"
    admin = f"http://127.0.0.1:{stack.port(8081)}"
    timeout = aiohttp.ClientTimeout(total=120)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:
        await wait_for_telemetry(http, admin)
        async with http.get(f"{admin}/metrics") as r:
            before = parse_metrics(await r.text())
        cls_url = f"http://127.0.0.1:{stack.port(8083)}/metrics"
        async with http.get(cls_url) as r:
            cls_before = parse_metrics(await r.text())
        kinds = ["clean"] * n_clean + ["pii"] * n_pii
        # interleave: one PII prompt every (n_clean+n_pii)/n_pii requests
        order = sorted(range(len(kinds)), key=lambda i: (i * 7919) % len(kinds))
        kinds = [kinds[i] for i in order]
        prompts = [clean_prompt(i) if k == "clean" else pii_prompt(i) for i, k in enumerate(kinds)]
        t0 = time.perf_counter()
        results = await asyncio.gather(*(one(http, url, p, max_tokens) for p in prompts))
        elapsed = time.perf_counter() - t0
        async with http.get(f"{admin}/metrics") as r:
            after = parse_metrics(await r.text())
        async with http.get(cls_url) as r:
            cls_after = parse_metrics(await r.text())
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    out: dict[str, Any] = {"seconds": round(elapsed, 2)}
    for kind in ("clean", "pii"):
        rs = [r for r, k in zip(results, kinds) if k == kind]
        out[kind] = {
            "sent": len(rs),
            "provider": sum(1 for s, b in rs if s == 200 and b.startswith("Provider/")),
            "local": sum(1 for s, b in rs if s == 200 and b.startswith("Local/")),
            "503": sum(1 for s, _ in rs if s == 503),
            "429": sum(1 for s, _ in rs if s == 429),
            "other": sum(1 for s, _ in rs if s not in (200, 503, 429)),
        }
    log_path = stack.run_dir / "provider-requests.jsonl"
    received = [line for line in log_path.read_text().splitlines() if line.strip()] if log_path.exists() else []
    leaked = [line for line in received if any(m in line for m in PII_MARKERS)]
    out["provider_log"] = {"requests": len(received), "with_pii": len(leaked), "leaked": leaked[:3]}
    out["classifier"] = classifier_counts(delta)
    logs = stack.run_dir / "logs"
    out["nats_violations"] = sum(line.lower().count("violation")
                                 for f in logs.glob("*.log") for line in f.read_text(errors="replace").splitlines())
    cd = {k: cls_after.get(k, 0.0) - cls_before.get(k, 0.0) for k in cls_after}
    served = sum(v for k, v in cd.items() if k.startswith('kinference_classify_seconds_count{classifier="pii"'))
    busy = sum(v for k, v in cd.items() if k.startswith('kinference_classify_seconds_sum{classifier="pii"'))
    out["service"] = {"answered": int(served), "busy_ms": round(busy * 1e3, 1),
                      "mean_us": round(busy / served * 1e6, 1) if served else 0.0,
                      "expired": int(sum(v for k, v in cd.items() if k.startswith("kinference_classify_expired")))}
    return out


VARIANTS = {
    "service": "classifier service over NATS, batched per event-loop turn (make run)",
    "no-batch": "classifier service over NATS, one request per message",
    "replicas2": "two classifier replicas in the queue group, batched",
    "in-process": "pii in the router's process (--in-process-classifier pii)",
}


def stack_class(variant: str) -> Any:
    """The make-run stack, changed only as ``variant`` says."""
    from kinference_simulators.stack import Proc, Stack

    class Variant(Stack):
        def plan(self, speed_profile: str, time_scale: float) -> list[Any]:
            procs = super().plan(speed_profile, time_scale)
            by = {p.name: p for p in procs}
            if variant == "no-batch":
                by["router"].argv.append("--no-classify-batching")
            elif variant == "in-process":
                by["policy-compiler"].argv += ["--in-process-classifier", "pii"]
            elif variant == "replicas2":
                first = by["classifier"]
                argv = list(first.argv)
                i = argv.index("--health-port")
                argv[i + 1] = str(self.port(8084))
                procs.insert(procs.index(first) + 1, Proc("classifier-2", argv,
                                                         ready_url=f"http://127.0.0.1:{self.port(8084)}/readyz"))
            return procs

    return Variant


async def run_round(args: argparse.Namespace, offset: int) -> dict[str, Any]:
    Stack = stack_class(args.variant)

    with tempfile.TemporaryDirectory(prefix="kinference-burst-") as tmp:
        stack = Stack(Path(tmp) / "run", offset)
        stack.prepare()
        await stack.start(args.speed_profile, 1.0, timeout=90)
        try:
            return await trial(stack, args.clean, args.pii, args.max_tokens)
        finally:
            await stack.stop()


def table(rounds: list[dict[str, Any]]) -> str:
    rows = [("round", "clean->provider", "clean local", "clean 503/429", "PII local", "PII refused",
             "PII at provider", "provider log", "classify ok", "deadline", "shed", "skipped", "mean ms")]
    for i, r in enumerate(rounds, 1):
        c, p, cl = r["clean"], r["pii"], r["classifier"]
        rows.append((str(i), str(c["provider"]), str(c["local"]), f'{c["503"]}/{c["429"]}', str(p["local"]),
                     str(p["503"] + p["429"] + p["other"]), str(p["provider"]),
                     f'{r["provider_log"]["requests"]} ({r["provider_log"]["with_pii"]} PII)',
                     str(int(cl.get("ok", 0))), str(int(cl.get("deadline", 0))), str(int(cl.get("shed", 0))),
                     str(int(cl.get("skipped", 0))), str(cl.get("mean_ms", 0))))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("| " + " | ".join(v.ljust(w) for v, w in zip(row, widths)) + " |" for row in rows)


async def amain(args: argparse.Namespace) -> int:
    import signal

    # SIGTERM stops the stack like Ctrl-C does (the stack's processes are ours to end)
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    rounds = []
    for i in range(args.rounds):
        rounds.append(await run_round(args, args.port_offset + i * 200))
        print(json.dumps(rounds[-1]), flush=True)
    print(table(rounds))
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"label": args.label, "variant": args.variant, "clean": args.clean, "pii": args.pii, "rounds": rounds,
                               "median_clean_to_provider": statistics.median(r["clean"]["provider"] for r in rounds)},
                              indent=2))
    print(f"wrote {out}")
    return 0 if all(r["provider_log"]["with_pii"] == 0 for r in rounds) else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.burst", description=__doc__.split("\n\n")[0])
    p.add_argument("--clean", type=int, default=180)
    p.add_argument("--pii", type=int, default=20)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--speed-profile", default="h100", help="as make run (default h100)")
    p.add_argument("--port-offset", type=int, default=int(os.environ.get("KINFERENCE_PORT_OFFSET", "30000")))
    p.add_argument("--variant", choices=sorted(VARIANTS), default="service",
                   help="; ".join(f"{k}: {v}" for k, v in VARIANTS.items()))
    p.add_argument("--label", default="")
    p.add_argument("--output", default=str(RESULTS))
    return asyncio.run(amain(p.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
