"""Classifier latency: ``make bench-classifier`` (``python -m bench.classifier``).

Measures the ``pii`` classifier on 1, 8 and 64 KB prompts, clean and with
personal data, two ways:

- ``in-process``: :meth:`Classifiers.classify`, what ``kinfctl classify``
  and the service handler run (size check, scan, validation);
- ``nats``: the router's :func:`kinference_common.classify_client.classify`
  against the service running as its own process
  (``python -m kinference_classifier``) on a local ``nats-server``: encode,
  publish, queue-group delivery, decode, classify, reply, decode.

Prompts are generated from a fixed seed: clean ones mix prose, log lines and
code (numbers, UUIDs, hashes, private IPs: the things a classifier must not
flag); PII ones are the same text with an e-mail address, a phone number and
a card number inserted at random places; ``hard clean`` ones are the free-text
eval's hard clean kinds one after another (capitalised products, cities,
famous people, code identifiers, dates: what the name and address rules read
and must leave alone). Requests run one after another (latency, not
throughput). Prints a table and writes ``bench/results/classifier.json`` as a
list of ``{size_kb, content, path, p50_us, p99_us, cpu_us, cpu_p99_us}``
(``cpu_us``, ``cpu_p99_us``: mean and p99 CPU time of the calling thread per
request, in-process only: on a shared machine wall-clock p99 measures the
neighbours as much as the code).

``--against REF`` also measures, in the same run and interleaved, the
classifier with the free-text rules (``freetext.py``) of git revision REF, and
prints the CPU ratio of this tree to it.

Targets: p99 under 1 ms in-process at 8 KB, under 2 ms over NATS.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "bench" / "results" / "classifier.json"
SIZES_KB = (1, 8, 64)

_WORDS = [
    "the",
    "model",
    "request",
    "latency",
    "cluster",
    "policy",
    "route",
    "token",
    "prompt",
    "answer",
    "quickly",
    "because",
    "every",
    "pod",
    "queue",
    "cache",
    "prefix",
    "would",
    "should",
    "could",
    "after",
    "before",
    "during",
    "about",
    "which",
    "their",
    "there",
    "system",
    "design",
    "network",
    "storage",
    "budget",
    "deadline",
    "result",
    "value",
    "number",
    "service",
    "user",
    "team",
    "report",
    "review",
    "change",
    "update",
    "server",
    "client",
    "error",
    "retry",
    "window",
    "metric",
    "gpu",
    "batch",
]


def _sentence(rng: random.Random) -> str:
    words = [rng.choice(_WORDS) for _ in range(rng.randint(6, 16))]
    return " ".join(words).capitalize() + "."


def _log_line(rng: random.Random) -> str:
    return (
        f"2024-0{rng.randint(1, 9)}-{rng.randint(10, 28)} {rng.randint(10, 23)}:"
        f"{rng.randint(10, 59)}:{rng.randint(10, 59)}.{rng.randint(100, 999)} INFO "
        f"req={uuid.UUID(int=rng.getrandbits(128))} took {rng.randint(1, 900)}ms "
        f"from 10.{rng.randint(0, 255)}.{rng.randint(0, 255)}.{rng.randint(1, 254)} "
        f"sha={rng.getrandbits(160):040x}"
    )


def _code_line(rng: random.Random) -> str:
    a, b = rng.choice(_WORDS), rng.choice(_WORDS)
    return f"    {a}_{b} = compute({a}, retries={rng.randint(1, 9)}, timeout={rng.random():.3f})"


def clean_text(size: int, rng: random.Random) -> str:
    parts: list[str] = []
    total = 0
    while total < size:
        kind = rng.random()
        line = _sentence(rng) if kind < 0.6 else _log_line(rng) if kind < 0.8 else _code_line(rng)
        parts.append(line)
        total += len(line) + 1
    return "\n".join(parts)[:size]


def pii_text(size: int, rng: random.Random) -> str:
    text = clean_text(size - 80, rng)
    for item in (" jane.doe@example.org ", " +44 20 7946 0958 ", " 4111 1111 1111 1111 "):
        at = rng.randrange(len(text))
        while at < len(text) and text[at] not in " \n":
            at += 1
        text = text[:at] + item + text[at:]
    return text


def prompts(seed: int = 7) -> dict[tuple[int, str], list[str]]:
    rng = random.Random(seed)
    return {
        (kb, content): [
            (clean_text if content == "clean" else pii_text)(kb * 1024, rng) for _ in range(8)
        ]
        for kb in SIZES_KB
        for content in ("clean", "pii")
    }


def free_text_prompts() -> dict[tuple[int, str], list[str]]:
    """The free-text eval's hard clean prose per size (needs Faker, the ``eval`` extra)."""
    from bench.eval_freetext import hard_clean_prose

    return {(kb, "hard clean"): hard_clean_prose(kb) for kb in SIZES_KB}


def classifiers_at(ref: str) -> object:
    """The in-process classifier with ``freetext.py`` as it is at git revision ``ref``."""
    import importlib.util

    from kinference_common.detectors import freetext, pii
    from kinference_classifier.core import Classifiers

    path = "libs/kinference_common/detectors/freetext.py"
    src = subprocess.run(["git", "-C", str(REPO), "show", f"{ref}:{path}"], capture_output=True, text=True)
    if src.returncode != 0:
        raise SystemExit(f"--against {ref}: {src.stderr.strip()}")
    mod = importlib.util.module_from_spec(importlib.util.spec_from_loader(f"freetext_{ref}", loader=None))  # type: ignore[arg-type]
    exec(compile(src.stdout, f"{ref}:{path}", "exec"), mod.__dict__)
    shaped = [r for r in pii.RULES if r.entity not in freetext.ENTITIES]
    at = next(i for i, r in enumerate(shaped) if r.entity == "phone")  # where RULES puts them
    cues = [pii.Rule(entity, pattern, validate) for entity, _rule, pattern, validate in mod.CUES]
    return Classifiers(detectors=(pii.PiiDetector(rules=(*shaped[:at], *cues, *shaped[at:])),))


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _iterations(kb: int, quick: bool) -> int:
    base = {1: 3000, 8: 2000, 64: 300}[kb]
    return base // 10 if quick else base


def bench_in_process(
    data: dict[tuple[int, str], list[str]], quick: bool, against: str | None = None
) -> list[dict[str, object]]:
    from kinference_classifier.core import Classifiers

    variants: dict[str, object] = {"in-process": Classifiers()}
    if against:
        variants[f"in-process@{against}"] = classifiers_at(against)
    for c in variants.values():
        c.warm_up()  # type: ignore[attr-defined]
    expected = {"clean": "pii-none", "pii": "pii-confirmed", "hard clean": "pii-none"}
    rows = []
    for (kb, content), texts in data.items():
        n = _iterations(kb, quick)
        wall: dict[str, list[float]] = {name: [] for name in variants}
        cpu: dict[str, list[float]] = {name: [] for name in variants}
        for i in range(n + n // 10):
            text = texts[i % len(texts)]
            for name, classifiers in variants.items():  # interleaved: both see the same load
                t0 = time.perf_counter_ns()
                c0 = time.thread_time_ns()
                reply = classifiers.classify("pii", [text])  # type: ignore[attr-defined]
                c1 = time.thread_time_ns()
                elapsed = (time.perf_counter_ns() - t0) / 1000
                if name == "in-process" and reply.tags != [expected[content]]:
                    raise SystemExit(f"bench prompt misclassified: {kb} KB {content} -> {reply.tags}")
                if i >= n // 10:  # the first tenth warms caches
                    wall[name].append(elapsed)
                    cpu[name].append((c1 - c0) / 1000)
        for name in variants:
            rows.append({
                **_row(kb, content, name, wall[name]),
                "cpu_us": round(sum(cpu[name]) / len(cpu[name]), 1),
                "cpu_p99_us": round(_pct(cpu[name], 0.99), 1),
            })
    return rows


def _row(kb: int, content: str, path: str, samples: list[float]) -> dict[str, object]:
    return {
        "size_kb": kb,
        "content": content,
        "path": path,
        "p50_us": round(_pct(samples, 0.50), 1),
        "p99_us": round(_pct(samples, 0.99), 1),
    }


async def _bench_nats(
    data: dict[tuple[int, str], list[str]], quick: bool
) -> list[dict[str, object]]:
    import nats
    from kinference_common.classify_client import classify
    from kinference_common import natsserver

    rows = []
    with natsserver.start() as server:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kinference_classifier",
                "--nats-url",
                server.url,
                "--health-port",
                "0",
                "--log-level",
                "warning",
                "--classifier",
                "pii",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ},
        )
        nc = await nats.connect(server.url)
        try:
            for _ in range(300):
                if (await classify(nc, "pii", ["hi"], 1.0)).outcome == "ok":
                    break
                await asyncio.sleep(0.1)
            else:
                raise SystemExit("classifier service did not start")
            for (kb, content), texts in data.items():
                n = _iterations(kb, quick)
                samples = []
                for i in range(n + n // 10):
                    t0 = time.perf_counter_ns()
                    reply = await classify(nc, "pii", [texts[i % len(texts)]], 1.0)
                    elapsed = (time.perf_counter_ns() - t0) / 1000
                    if reply.outcome != "ok":
                        raise SystemExit(f"request failed: {reply.outcome} {reply.detail}")
                    if i >= n // 10:
                        samples.append(elapsed)
                rows.append(_row(kb, content, "nats", samples))
        finally:
            await nc.close()
            proc.terminate()
            proc.wait(timeout=20)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="a tenth of the iterations")
    p.add_argument("--no-nats", action="store_true", help="in-process only")
    p.add_argument("--out", type=Path, default=OUT, help="where to write the JSON rows")
    p.add_argument("--against", metavar="REF", help="also measure freetext.py of git revision REF (e.g. main)")
    args = p.parse_args(argv)
    data = prompts()
    try:
        data.update(free_text_prompts())
    except ImportError:  # Faker (the eval extra) missing: the shaped-identifier prompts only
        pass
    rows = bench_in_process(data, args.quick, args.against)
    if not args.no_nats:
        try:
            import uvloop

            rows += uvloop.run(_bench_nats(data, args.quick))
        except ImportError:
            rows += asyncio.run(_bench_nats(data, args.quick))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"{os.cpu_count()} CPUs, load average {load:.2f} (p99 is sensitive to other load)")
    print(f"{'size':>6}  {'content':<10}  {'path':<18}  {'p50 us':>9}  {'p99 us':>9}  {'cpu us':>8}  {'cpu p99':>8}  target")
    base = {(r["size_kb"], r["content"]): r for r in rows if str(r["path"]).startswith("in-process@")}
    for r in rows:
        target = ""
        if r["size_kb"] == 8 and "@" not in str(r["path"]):
            limit = 1000 if r["path"] == "in-process" else 2000
            target = f"p99 < {limit} us: " + ("met" if float(r["p99_us"]) < limit else "MISSED")
        b = base.get((r["size_kb"], r["content"]))
        if b is not None and r["path"] == "in-process":
            target += f"  cpu {float(r['cpu_us']) / float(b['cpu_us']):.2f}x of {str(b['path'])[11:]}"
        cpu = f"{r['cpu_us']:>8.1f}  {r['cpu_p99_us']:>8.1f}" if "cpu_us" in r else f"{'':>8}  {'':>8}"
        print(
            f"{r['size_kb']:>4} KB  {r['content']:<10}  {r['path']:<18}  {r['p50_us']:>9.1f}  "
            f"{r['p99_us']:>9.1f}  {cpu}  {target}"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
