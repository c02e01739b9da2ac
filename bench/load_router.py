"""Many long streams through the router: ``make load-router`` (``python -m bench.load_router``).

The Kinference router runs as its own process (``python -m kinference_router``,
a real nats-server, a compiled pool whose one worker set's endpoint is a stub
upstream, fresh endpoint telemetry on NATS, auth none), pinned to one core;
the stub (:mod:`bench.stub_upstream`, its own process) streams a chunk every
``--chunk-interval`` seconds, ``--chunks`` content chunks per request (about
10 s per stream by default). ``--streams`` client tasks (500) keep
re-issuing streaming chat completions for ``--duration`` seconds (60), so
that about 500 streams are open through the router the whole time; then no
new request starts and those in flight finish.

Every stream is checked whole: status 200, every content chunk in order
(``tok0`` .. ``tok<N-1>``), the finish and usage chunks, then
``data: [DONE]``. An exception, a status other than 200, or a stream that
ends early is an error.

The router's RSS (``VmRSS`` of ``/proc/<pid>/status``) and open file
descriptors are sampled every second; memory is "flat" when the RSS at the
end of the load is within ``--flat-tolerance`` (10%) of the RSS after
``--warmup`` (the first full wave of streams). After the drain the router's
``kinference_inflight`` gauge must be back to 0 and its descriptors at most
the idle count plus the pooled keep-alive upstream connections (one per
stream that was open at once): no leaked connection or ledger entry.

Prints a table and writes ``bench/results/load_router.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import msgspec

from bench import harness

RESULTS = Path(__file__).resolve().parent / "results" / "load_router.json"


@dataclass
class Stats:
    started: int = 0
    completed: int = 0
    errors: int = 0
    active: int = 0
    max_active: int = 0
    chunks: int = 0
    error_samples: list[str] = field(default_factory=list)

    def error(self, what: str) -> None:
        self.errors += 1
        if len(self.error_samples) < 10:
            self.error_samples.append(what)


_decoder = msgspec.json.Decoder()


def check_stream(raw: bytes, chunks: int) -> str | None:
    """None when ``raw`` is a whole stream of the stub, else what is wrong."""
    events = [e for e in raw.split(b"\n\n") if e.strip()]
    if not events or events[-1].strip() != b"data: [DONE]":
        return f"no [DONE] at the end ({len(events)} events)"
    tokens: list[str] = []
    finish = usage = False
    for ev in events[:-1]:
        if not ev.startswith(b"data: "):
            return f"not an SSE data line: {ev[:80]!r}"
        obj = _decoder.decode(ev[6:])
        if obj.get("usage"):
            usage = True
        for choice in obj.get("choices") or ():
            content = (choice.get("delta") or {}).get("content")
            if content:
                tokens.append(content)
            if choice.get("finish_reason") == "stop":
                finish = True
    expected = [f"tok{i}" for i in range(chunks)]
    if tokens != expected:
        return f"content chunks {len(tokens)}/{chunks} (first wrong: {next((t for t, e in zip(tokens, expected) if t != e), None)})"
    if not finish or not usage:
        return "finish or usage chunk missing"
    return None


async def one_stream(session: aiohttp.ClientSession, url: str, body: bytes, chunks: int, stats: Stats) -> None:
    stats.started += 1
    stats.active += 1
    stats.max_active = max(stats.max_active, stats.active)
    try:
        async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as r:
            if r.status != 200:
                stats.error(f"status {r.status}: {(await r.text())[:200]}")
                return
            parts = []
            async for chunk in r.content.iter_any():
                parts.append(chunk)
                stats.chunks += chunk.count(b"data: ")
            why = check_stream(b"".join(parts), chunks)
            if why is None:
                stats.completed += 1
            else:
                stats.error(why)
    except Exception as exc:  # noqa: BLE001 - every failure is counted, none stops the load
        stats.error(f"{type(exc).__name__}: {exc}"[:200])
    finally:
        stats.active -= 1


async def client(session: aiohttp.ClientSession, url: str, body: bytes, chunks: int, stats: Stats,
                 until: float, delay: float) -> None:
    await asyncio.sleep(delay)  # the first wave spread over a second, not one burst
    while time.monotonic() < until:
        await one_stream(session, url, body, chunks, stats)


async def scrape_inflight(metrics_url: str) -> float | None:
    try:
        async with aiohttp.ClientSession() as s, s.get(metrics_url) as r:
            text = await r.text()
    except Exception:  # noqa: BLE001 - a sample missed, not a failure
        return None
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("kinference_inflight{"))


def fd_count(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


async def amain(args: argparse.Namespace) -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, max(soft, 8 * args.streams + 1024))
    if want > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))  # inherited by the router and the stub
    cpus = sorted(os.sched_getaffinity(0))
    if args.no_pin or len(cpus) < 2:
        router_cpu = client_cpu = None
    else:
        router_cpu, client_cpu = args.router_cpu, args.client_cpu
        os.sched_setaffinity(0, {client_cpu})
    body = json.dumps({"model": harness.MODEL, "stream": True, "max_tokens": args.chunks,
                       "messages": [{"role": "user", "content": "Tell me a long story."}]}).encode()
    stats = Stats()
    samples: list[dict[str, Any]] = []
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="kinference-load-") as tmp:
        log_dir = Path(tmp)
        stub_port = harness.free_port()
        stub = harness.start_stub(stub_port, log_dir, client_cpu, chunks=args.chunks, interval=args.chunk_interval)
        try:
            async with harness.control_plane([f"127.0.0.1:{stub_port}"], client_cpu) as ctl:
                port, admin = harness.free_port(), harness.free_port()
                router = await asyncio.to_thread(harness.start_kinference, port, admin, ctl.url, log_dir,
                                                 router_cpu)
                try:
                    await ctl.publish_telemetry()
                    await asyncio.sleep(0.3)
                    url = f"http://127.0.0.1:{port}/v1/chat/completions"
                    metrics_url = f"http://127.0.0.1:{admin}/metrics"
                    idle_rss, idle_fds = harness.rss_kb(router.pid), fd_count(router.pid)
                    print(f"router pid {router.pid} on CPU {router_cpu}; client, stub, nats on CPU {client_cpu}; "
                          f"{args.streams} streams x {args.duration:g}s, a chunk every {args.chunk_interval:g}s, "
                          f"{args.chunks} chunks per stream; idle RSS {idle_rss} KiB, {idle_fds} fds", flush=True)
                    result = await run_load(args, url, metrics_url, body, router, stats, samples)
                    result.update(idle_rss_kb=idle_rss, idle_fds=idle_fds)
                    if router.proc.poll() is not None:
                        stats.error(f"router exited with code {router.proc.returncode}")
                finally:
                    await asyncio.to_thread(router.stop)
        finally:
            stub.stop()
    return report(args, stats, samples, result)


async def run_load(args: argparse.Namespace, url: str, metrics_url: str, body: bytes, router: harness.Process,
                   stats: Stats, samples: list[dict[str, Any]]) -> dict[str, Any]:
    t0 = time.monotonic()
    until = t0 + args.duration
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=max(10.0, 20 * args.chunk_interval))
    stop_sampling = asyncio.Event()

    async def sampler() -> None:
        n = 0
        while not stop_sampling.is_set():
            s: dict[str, Any] = {"t": round(time.monotonic() - t0, 1), "rss_kb": harness.rss_kb(router.pid),
                                 "fds": fd_count(router.pid), "open_streams": stats.active,
                                 "completed": stats.completed, "errors": stats.errors}
            if n % 5 == 0:
                s["router_inflight"] = await scrape_inflight(metrics_url)
            samples.append(s)
            if n % 10 == 0:
                print(f"  t={s['t']:5.1f}s open {s['open_streams']:4d}  done {s['completed']:5d}  "
                      f"errors {s['errors']}  RSS {s['rss_kb']} KiB  fds {s['fds']}", flush=True)
            n += 1
            try:
                await asyncio.wait_for(stop_sampling.wait(), 1.0)
            except TimeoutError:
                pass

    sampling = asyncio.create_task(sampler())
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        workers = [asyncio.create_task(client(session, url, body, args.chunks, stats, until,
                                              i / args.streams)) for i in range(args.streams)]
        await asyncio.gather(*workers)
        drained_at = time.monotonic() - t0
    await asyncio.sleep(2.0)  # the router closes what it held
    after = {"rss_kb": harness.rss_kb(router.pid), "fds": fd_count(router.pid),
             "router_inflight": await scrape_inflight(metrics_url)}
    stop_sampling.set()
    await sampling
    return {"drained_at_s": round(drained_at, 1), "after_drain": after}


def report(args: argparse.Namespace, stats: Stats, samples: list[dict[str, Any]], result: dict[str, Any]) -> int:
    load = [s for s in samples if s["t"] <= args.duration and s["rss_kb"]]
    warm = next((s for s in load if s["t"] >= args.warmup), load[0] if load else None)
    end = load[-1] if load else None
    steady = [s["open_streams"] for s in load if s["t"] >= args.warmup]
    after = result.get("after_drain", {})
    growth = (end["rss_kb"] - warm["rss_kb"]) / warm["rss_kb"] if warm and end else None
    peak = max((s["rss_kb"] for s in samples if s["rss_kb"]), default=None)
    flat = growth is not None and growth <= args.flat_tolerance
    inflight_zero = after.get("router_inflight") == 0
    idle_fds = result.get("idle_fds")
    # the router's client pool keeps up to one idle keep-alive connection per
    # stream that was open at once (closed after 30 s idle); more is a leak
    fds_back = idle_fds is not None and after.get("fds") is not None \
        and after["fds"] <= idle_fds + stats.max_active + 10
    ok = stats.errors == 0 and stats.completed == stats.started and flat and inflight_zero and fds_back \
        and bool(steady) and min(steady) >= 0.9 * args.streams
    out = {
        "streams": args.streams, "duration_s": args.duration, "chunks_per_stream": args.chunks,
        "chunk_interval_s": args.chunk_interval, "warmup_s": args.warmup,
        "started": stats.started, "completed": stats.completed, "errors": stats.errors,
        "error_samples": stats.error_samples, "sse_events_received": stats.chunks,
        "max_open_streams": stats.max_active,
        "open_streams_after_warmup_min": min(steady) if steady else None,
        "open_streams_after_warmup_mean": round(sum(steady) / len(steady), 1) if steady else None,
        "rss_idle_kb": result.get("idle_rss_kb"), "rss_after_warmup_kb": warm["rss_kb"] if warm else None,
        "rss_end_of_load_kb": end["rss_kb"] if end else None, "rss_peak_kb": peak,
        "rss_after_drain_kb": after.get("rss_kb"),
        "rss_growth_after_warmup_pct": round(100 * growth, 2) if growth is not None else None,
        "memory_flat": flat, "fds_idle": idle_fds, "fds_after_drain": after.get("fds"),
        "router_inflight_after_drain": after.get("router_inflight"), "drained_at_s": result.get("drained_at_s"),
        "ok": ok, "samples": samples,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    rows = [
        ("streams started / completed", f"{stats.started} / {stats.completed}"),
        ("errors", f"{stats.errors}" + (f"  e.g. {stats.error_samples[0]}" if stats.error_samples else "")),
        ("SSE events received", f"{stats.chunks}"),
        ("open streams after warm-up (min / mean / max)",
         f"{out['open_streams_after_warmup_min']} / {out['open_streams_after_warmup_mean']} / {stats.max_active}"),
        ("router RSS idle", f"{out['rss_idle_kb']} KiB"),
        (f"router RSS after warm-up (t={warm['t'] if warm else '?'}s)", f"{out['rss_after_warmup_kb']} KiB"),
        (f"router RSS end of load (t={end['t'] if end else '?'}s)", f"{out['rss_end_of_load_kb']} KiB"),
        ("growth after warm-up", (f"{out['rss_growth_after_warmup_pct']}% "
                                  f"({'flat' if flat else 'NOT flat'}, tolerance {100 * args.flat_tolerance:g}%)")),
        ("router RSS peak / after drain", f"{peak} / {out['rss_after_drain_kb']} KiB"),
        ("router fds idle / after drain", (f"{idle_fds} / {after.get('fds')} (pooled upstream keep-alive "
                                           "connections included)")),
        ("router kinference_inflight after drain", f"{after.get('router_inflight')}"),
        ("result", "OK" if ok else "FAILED"),
    ]
    width = max(len(k) for k, _ in rows)
    print()
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    print(f"\nwrote {RESULTS.relative_to(harness.REPO)}")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="make load-router", description=__doc__.split("\n\n")[0])
    p.add_argument("--streams", type=int, default=500, help="concurrent streams (default 500)")
    p.add_argument("--duration", type=float, default=60.0, help="seconds new streams keep starting (default 60)")
    p.add_argument("--chunks", type=int, default=100, help="content chunks per stream (default 100)")
    p.add_argument("--chunk-interval", type=float, default=0.1, help="seconds between chunks (default 0.1)")
    p.add_argument("--warmup", type=float, default=15.0,
                   help="seconds before the RSS baseline (default 15: the first wave has finished)")
    p.add_argument("--flat-tolerance", type=float, default=0.10,
                   help="RSS growth after warm-up still called flat (default 0.10)")
    p.add_argument("--router-cpu", type=int, default=0)
    p.add_argument("--client-cpu", type=int, default=1)
    p.add_argument("--no-pin", action="store_true", help="do not pin router and client to separate cores")
    args = p.parse_args(argv)
    try:
        import uvloop
    except ImportError:
        return asyncio.run(amain(args))
    return uvloop.run(amain(args))


if __name__ == "__main__":
    sys.exit(main())
