"""CPU per request of the router's two front doors, measured on a running router.

``python -m bench.picker_cpu --pid PID --epp-port N --data-url URL``: sends
``--requests`` chat completions (``max_tokens`` 1) through the router's data
port, then the same number through its Endpoint Picker, playing the
gateway's part (tests/epp/client.py). Both go to the same simulated pods. It
reads the router process's CPU time (``/proc/PID/stat``: user + system)
before and after each phase and prints the CPU seconds per request of each
door, with their ratio.

It also times, in this process, what each ext_proc message costs the
picker's Python code (``PickStream.on``, by message kind, thread CPU time).
For that it runs a second, in-process picker on the same NATS pool, using
``--nats-url``, ``--nats-user`` and ``--nats-password-file``.

Start the stack with ``make run``, and a router with ``--epp-port`` next to
it; see docs/endpoint-picker.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import aiohttp


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def body(i: int) -> bytes:
    return json.dumps({"model": "qwen-2.5", "max_tokens": 1,
                       "messages": [{"role": "user", "content": f"Say hello, number {i}."}]}).encode()


async def http_phase(url: str, n: int, session: aiohttp.ClientSession) -> None:
    for i in range(n):
        async with session.post(url, data=body(i), headers={"content-type": "application/json"}) as r:
            await r.read()
            assert r.status == 200, r.status


async def epp_phase(port: int, n: int, session: aiohttp.ClientSession) -> None:
    from tests.epp.client import EppClient

    client = EppClient(port)
    try:
        for i in range(n):
            rt = await client.roundtrip("/v1/chat/completions", body(i), session=session)
            assert rt.status == 200, rt.body
    finally:
        await client.close()


async def per_message(args: argparse.Namespace, n: int) -> dict[str, tuple[int, float]]:
    """Thread CPU time of PickStream.on per message kind, on an in-process picker."""
    from kinference_common import bus, natsauth
    from kinference_router import epp as epp_mod
    from kinference_router.app import Router, RouterSettings
    from kinference_router.tenants import Authenticator
    from kinference_router.upstream import SecretFiles

    costs: dict[str, list[float]] = defaultdict(list)
    real_on = epp_mod.PickStream.on

    async def timed(self: Any, msg: Any) -> Any:
        t = time.thread_time()
        out = await real_on(self, msg)
        costs[msg.WhichOneof("request")].append(time.thread_time() - t)
        return out

    epp_mod.PickStream.on = timed  # type: ignore[method-assign]
    nc = await bus.connect(args.nats_url, name="bench-picker", **natsauth.connect_options(args))
    router = Router(RouterSettings(replica_sync=False), Authenticator("none"), SecretFiles(None), nc=nc)
    await router.start()
    server = epp_mod.EppServer(router, epp_mod.EppSettings())
    await server.start("127.0.0.1", 0)
    try:
        for _ in range(100):
            if router.ready():
                break
            await asyncio.sleep(0.05)
        async with aiohttp.ClientSession() as session:
            await epp_phase(server.port, n, session)
    finally:
        epp_mod.PickStream.on = real_on  # type: ignore[method-assign]
        await server.close()
        await router.stop()
        await nc.close()
    return {k: (len(v), sum(v) / len(v)) for k, v in costs.items()}


async def main(args: argparse.Namespace) -> None:
    n = args.requests
    async with aiohttp.ClientSession() as session:
        await http_phase(args.data_url, 20, session)  # warm-up
        await epp_phase(args.epp_port, 20, session)
        rows = []
        for name, phase in (("HTTP router (data port)", http_phase(args.data_url, n, session)),
                            ("Endpoint Picker (ext_proc)", epp_phase(args.epp_port, n, session))):
            before = cpu_seconds(args.pid)
            await phase
            rows.append((name, (cpu_seconds(args.pid) - before) / n))
    base = rows[0][1]
    print(f"router process CPU per request, {n} sequential requests each")
    print(f"| front door | CPU ms/request | ratio to the router |\n|---|---|---|")
    for name, cpu in rows:
        print(f"| {name} | {cpu * 1000:.2f} | {cpu / base:.2f} |")
    if args.nats_url:
        print("\nPickStream.on, thread CPU per message (in-process picker; the gRPC core's threads excluded)")
        print("| message | count | µs each |\n|---|---|---|")
        for kind, (count, mean) in sorted((await per_message(args, n)).items()):
            print(f"| {kind} | {count} | {mean * 1e6:.0f} |")


if __name__ == "__main__":
    from kinference_common import natsauth

    p = argparse.ArgumentParser(prog="python -m bench.picker_cpu", description=__doc__.split("\n\n")[0])
    p.add_argument("--pid", type=int, required=True, help="the router process")
    p.add_argument("--epp-port", type=int, required=True)
    p.add_argument("--data-url", required=True, help="the router's chat completions URL")
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--nats-url", default="", help="also time each message in an in-process picker on this NATS")
    natsauth.add_arguments(p, default_user=natsauth.ROUTER)
    asyncio.run(main(p.parse_args()))
