"""Telemetry-collector benchmark: ``make bench-collector`` (``python -m bench.collector``).

Short runs (a few seconds each):

1. parser: the collector's vLLM parser vs ``prometheus_client.parser.
   text_string_to_metric_families`` on the same realistic page (histograms
   with full bucket sets, ``_created`` series, process and HTTP metrics);
2. scrape throughput: the collector's real scrape path (HTTP GET over
   localhost with its client, parse, derive, offer to a publisher that
   drops) against N page servers in another process whose pages change every
   100 ms; ``scrapes_per_s_per_core`` = scrapes / CPU seconds of the collector
   process, so the servers' CPU does not count;
   Then the fetch alone: CPU per GET with the collector's client against
   aiohttp's ``ClientSession`` on the same pages, in alternating rounds;
3. publish lag: the same with a real nats-server and the real publisher at
   the default 100 ms interval; the servers are told to change one page
   (``waiting`` = a fresh value) and the lag is from that change being served
   to the state with that value arriving on its NATS subject.

Results: a table on stdout and ``bench/results/collector.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results" / "collector.json"


# ----------------------------------------------------------------- page servers


async def _serve(n: int, engines: int) -> None:
    """N page servers (one port each); page changes every 100 ms; ``POST /set?waiting=K``."""
    from aiohttp import web

    from kinference_collector import pages

    states = [pages.VllmPage(engines=engines, running=8, waiting=2, kv_usage=0.3) for _ in range(n)]
    bodies = [pages.render_vllm(s).encode() for s in states]
    changed_at = [0.0] * n

    def make(i: int) -> web.Application:
        async def metrics(_: web.Request) -> web.Response:
            return web.Response(body=bodies[i], content_type="text/plain")

        async def set_(req: web.Request) -> web.Response:
            states[i].waiting = int(req.query["waiting"])
            bodies[i] = pages.render_vllm(states[i]).encode()
            changed_at[i] = time.time()
            return web.json_response({"at": changed_at[i]})

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        app.router.add_post("/set", set_)
        return app

    runners, ports = [], []
    for i in range(n):
        r = web.AppRunner(make(i), access_log=None)
        await r.setup()
        site = web.TCPSite(r, "127.0.0.1", 0)
        await site.start()
        runners.append(r)
        ports.append(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
    print(json.dumps({"ports": ports, "page_bytes": len(bodies[0])}), flush=True)
    rnd = random.Random(1)
    while True:  # traffic: counters and histograms move
        await asyncio.sleep(0.1)
        for i, s in enumerate(states):
            s.advance(rnd.randint(0, 5), prompt=rnd.randint(200, 4000), hit=rnd.random(),
                      ttft=rnd.uniform(0.05, 0.5), queue=0.02, prefill=rnd.uniform(0.01, 0.2))
            s.running = rnd.randint(0, 64)
            bodies[i] = pages.render_vllm(s).encode()


class Servers:
    def __init__(self, n: int, engines: int = 1) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.collector", "--serve", str(n), "--engines", str(engines)],
            stdout=subprocess.PIPE, text=True,
        )
        assert self.proc.stdout is not None
        info = json.loads(self.proc.stdout.readline())
        self.ports: list[int] = info["ports"]
        self.page_bytes: int = info["page_bytes"]

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# ---------------------------------------------------------------------- runs


def bench_parser(engines: int = 1, seconds: float = 1.0) -> dict[str, Any]:
    from prometheus_client.parser import text_string_to_metric_families

    from kinference_collector import pages
    from kinference_collector.promparse import VllmReader, parse_vllm

    p = pages.VllmPage(engines=engines, running=8, waiting=2, kv_usage=0.3)
    p.advance(1000)
    text = pages.render_vllm(p)
    body = text.encode()

    def rate(fn: Any, arg: Any) -> float:
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            fn(arg)
            n += 1
        return (time.perf_counter() - t0) / n

    fast = rate(parse_vllm, body)
    ref = rate(lambda t: [f for f in text_string_to_metric_families(t)], text)
    # the collector's reader on one endpoint's pages as they move (every value
    # changes between two scrapes): one full parse in 10, the rest from the shape
    moving = []
    for _ in range(16):
        p.running, p.waiting = p.running + 1, max(0, p.waiting - 1)
        p.advance(37)
        moving.append(pages.render_vllm(p).encode())
    reader = VllmReader(full_every=10)
    turn = iter(range(1 << 62))
    followed = rate(lambda _: reader.parse(moving[next(turn) % len(moving)]), None)
    return {
        "page_bytes": len(body),
        "page_lines": text.count("\n"),
        "fast_us": fast * 1e6,
        "reader_us": followed * 1e6,
        "prometheus_client_us": ref * 1e6,
        "speedup": ref / fast,
    }


def _collector(ports: list[int], interval: float, bus: Any) -> Any:
    from kinference_collector.derive import DeriveConfig
    from kinference_collector.discovery import ListDiscovery, Target
    from kinference_collector.publish import Publisher
    from kinference_collector.service import Collector, CollectorConfig

    targets = [Target(namespace="bench", worker_set="ws", pod=f"p-{i}", address=f"127.0.0.1:{port}",
                      model="m") for i, port in enumerate(ports)]
    cfg = CollectorConfig(interval=interval, timeout=2.0, discovery_interval=3600,
                          derive=DeriveConfig(models_interval=3600))
    return Collector(cfg, ListDiscovery(targets), Publisher(bus, cfg.min_publish_interval))


async def bench_scrape(ports: list[int], seconds: float) -> dict[str, Any]:
    from kinference_collector.publish import NullBus

    c = _collector(ports, 0.0, NullBus())
    for tr in c.trackers.values():
        tr.models_due = float("inf")
    await c.start()
    await asyncio.sleep(0.3)  # connections up
    s0, cpu0, t0 = c.scrapes, time.process_time(), time.perf_counter()
    await asyncio.sleep(seconds)
    scrapes, cpu, wall = c.scrapes - s0, time.process_time() - cpu0, time.perf_counter() - t0
    errors = sum(tr.scrape_errors for tr in c.trackers.values())
    await c.stop()
    return {
        "endpoints": len(ports),
        "scrapes": scrapes,
        "cpu_seconds": cpu,
        "wall_seconds": wall,
        "scrapes_per_s_per_core": scrapes / cpu if cpu > 0 else 0.0,
        "scrapes_per_s_wall": scrapes / wall,
        "errors": errors,
    }


async def bench_fetch(ports: list[int], fetches: int = 1500, rounds: int = 4) -> dict[str, Any]:
    """CPU per GET of a page: the collector's client (``upstream_http``, what
    ``scrape.fetch`` uses) against aiohttp's ``ClientSession`` set up as the
    collector used to, the same pages from the same servers, in alternating
    rounds so that the machine's drift falls on both. The client's side is the
    collector's whole ``fetch`` (its timeout, status, size and encoding
    checks), aiohttp's a bare GET and read: the ratio errs in aiohttp's favour."""
    import aiohttp

    from kinference_collector.scrape import HEADERS, fetch, new_client

    urls = [f"http://127.0.0.1:{p}/metrics" for p in ports]
    client = new_client()
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30),
                                    headers=dict(HEADERS), auto_decompress=False)

    async def with_client(url: str) -> bytes:
        return await fetch(client, url, 2.0, 1 << 22)

    async def with_aiohttp(url: str) -> bytes:
        async with session.get(url, allow_redirects=False) as resp:
            return await resp.read()

    cpu = {"client": 0.0, "aiohttp": 0.0}
    try:
        for name, get in (("client", with_client), ("aiohttp", with_aiohttp)):  # connections up
            for url in urls:
                await get(url)
        for _ in range(rounds):
            for name, get in (("client", with_client), ("aiohttp", with_aiohttp)):
                c0 = time.process_time()
                for i in range(fetches):
                    await get(urls[i % len(urls)])
                cpu[name] += time.process_time() - c0
    finally:
        await client.close()
        await session.close()
    n = fetches * rounds
    client_us, aiohttp_us = cpu["client"] / n * 1e6, cpu["aiohttp"] / n * 1e6
    return {"fetches": n, "client_us": client_us, "aiohttp_us": aiohttp_us, "aiohttp_over_client": aiohttp_us / client_us}


async def bench_lag(ports: list[int], changes: int, interval: float) -> dict[str, Any]:
    import aiohttp
    import msgspec
    import nats

    from kinference_collector.publish import NatsBus
    from kinference_common import bus, natsserver, subjects
    from kinference_common.messages import EndpointState

    server = natsserver.start()
    try:
        nc = await nats.connect(server.url)
        nats_bus = NatsBus(nc)
        await nats_bus.start()
        c = _collector(ports, interval, nats_bus)
        dec = msgspec.json.Decoder(EndpointState)
        waiting: dict[tuple[str, int], asyncio.Future[float]] = {}

        async def cb(msg: Any) -> None:
            st = dec.decode(msg.data)
            fut = waiting.get((st.pod, st.queued or 0))
            if fut is not None and not fut.done():
                fut.set_result(time.time())

        sub_nc = await nats.connect(server.url)
        await sub_nc.subscribe(f"{subjects.TELEMETRY_ENDPOINT_PREFIX}.>", cb=cb)
        await bus.sync(sub_nc)
        await c.start()
        await asyncio.sleep(0.5)
        lags: list[float] = []
        rnd = random.Random(7)
        async with aiohttp.ClientSession() as http:
            for k in range(changes):
                i = rnd.randrange(len(ports))
                value = 1000 + k
                fut: asyncio.Future[float] = asyncio.get_running_loop().create_future()
                waiting[(f"p-{i}", value)] = fut
                async with http.post(f"http://127.0.0.1:{ports[i]}/set?waiting={value}") as r:
                    changed = (await r.json())["at"]
                arrived = await asyncio.wait_for(fut, 10)
                lags.append(max(0.0, arrived - changed) * 1e3)
                await asyncio.sleep(rnd.uniform(0, interval))
        published = c.publisher.published
        await c.stop()
        await sub_nc.drain()
        await nc.drain()
    finally:
        server.stop()
    lags.sort()
    return {
        "endpoints": len(ports),
        "interval_ms": interval * 1e3,
        "changes": len(lags),
        "publish_lag_ms_p50": statistics.median(lags),
        "publish_lag_ms_p99": lags[min(len(lags) - 1, int(round(0.99 * (len(lags) - 1))))],
        "publish_lag_ms_max": lags[-1],
        "published": published,
    }


def _table(rows: list[tuple[str, str]]) -> str:
    w = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{w}}  {v}" for k, v in rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.collector", description=__doc__.splitlines()[0])
    ap.add_argument("--endpoints", type=int, default=50, help="page servers for the throughput run")
    ap.add_argument("--seconds", type=float, default=3.0, help="length of the throughput run")
    ap.add_argument("--fetches", type=int, default=1500, help="GETs per round of the fetch run (4 rounds)")
    ap.add_argument("--changes", type=int, default=60, help="page changes timed in the lag run")
    ap.add_argument("--interval", type=float, default=0.1, help="scrape interval of the lag run")
    ap.add_argument("--engines", type=int, default=1, help="engine label values per page")
    ap.add_argument("--serve", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    import logging

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    try:
        import uvloop

        run = uvloop.run
        loop_name = "uvloop"
    except ImportError:  # pragma: no cover
        run, loop_name = asyncio.run, "asyncio"
    if args.serve:
        try:
            run(_serve(args.serve, args.engines))
        except KeyboardInterrupt:
            pass
        return 0

    parser = bench_parser(args.engines)
    servers = Servers(args.endpoints, args.engines)
    try:
        scrape = run(bench_scrape(servers.ports, args.seconds))
        fetch = run(bench_fetch(servers.ports, args.fetches))
    finally:
        servers.close()
    lag_servers = Servers(min(10, args.endpoints), args.engines)
    try:
        lag = run(bench_lag(lag_servers.ports, args.changes, args.interval))
    finally:
        lag_servers.close()

    result = {
        "scrapes_per_s_per_core": round(scrape["scrapes_per_s_per_core"], 1),
        "publish_lag_ms_p99": round(lag["publish_lag_ms_p99"], 2),
        "publish_lag_ms_p50": round(lag["publish_lag_ms_p50"], 2),
        "parser_speedup_vs_prometheus_client": round(parser["speedup"], 1),
        "parser": {k: round(v, 2) if isinstance(v, float) else v for k, v in parser.items()},
        "scrape": {k: round(v, 3) if isinstance(v, float) else v for k, v in scrape.items()},
        "fetch": {k: round(v, 2) if isinstance(v, float) else v for k, v in fetch.items()},
        "lag": {k: round(v, 2) if isinstance(v, float) else v for k, v in lag.items()},
        "env": {"python": platform.python_version(), "loop": loop_name, "cpus": os.cpu_count(),
                "engines_per_page": args.engines},
        "target": {"scrapes_per_s_per_core": 1000},
    }
    rows = [
        ("page", f"{parser['page_bytes']} bytes, {parser['page_lines']} lines, {args.engines} engine(s)"),
        ("parse (kinference)", f"{parser['fast_us']:.0f} us"),
        ("parse, a pod's moving pages (1 in 10 in full)", f"{parser['reader_us']:.0f} us "
                                                           "(the collector's VllmReader)"),
        ("parse (prometheus_client)", f"{parser['prometheus_client_us']:.0f} us"),
        ("parser speedup", f"{parser['speedup']:.1f}x"),
        ("scrape+parse+derive", f"{scrape['scrapes_per_s_per_core']:.0f} /s per core "
                                f"({scrape['scrapes_per_s_wall']:.0f} /s wall, {scrape['endpoints']} endpoints, "
                                f"{scrape['errors']} errors)"),
        ("fetch, CPU per GET", f"{fetch['client_us']:.0f} us with the collector's client, "
                               f"{fetch['aiohttp_us']:.0f} us with aiohttp's ClientSession "
                               f"({fetch['aiohttp_over_client']:.2f}x; {fetch['fetches']} each)"),
        ("publish lag p50 / p99 / max", f"{lag['publish_lag_ms_p50']:.1f} / {lag['publish_lag_ms_p99']:.1f} / "
                                        f"{lag['publish_lag_ms_max']:.1f} ms "
                                        f"({lag['changes']} changes, interval {lag['interval_ms']:.0f} ms)"),
    ]
    print(_table(rows))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
