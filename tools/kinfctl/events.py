"""``kinfctl events [--pool NS/NAME]``: follow decision events on NATS, one
line each (``-o json`` for the raw events, one JSON object per line).

A line reads: time, decision id, pool, tenant, model (``requested->sent``),
rule, outcome (the backend and endpoint it was routed to, or the rejection
code), tags, and the decision's own time in microseconds. A routed decision
that could not be carried out (the send failed after it left, or an Endpoint
Picker had no egress for a Provider pick) has a second event, whose outcome
reads ``BACKEND [ENDPOINT] then CODE``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time
from typing import Any

import msgspec

from kinference_common import bus, natsauth, subjects
from kinference_common.engine.trace import DecisionTrace
from kinfctl import localstack
from kinfctl.main import EXIT_OK, CommandError, split_pool

_decoder = msgspec.json.Decoder(DecisionTrace)


def register(sub: Any) -> None:
    p = sub.add_parser("events", help="follow routing decisions as they happen (NATS)",
                       description=__doc__.split("\n\n", 1)[1] if __doc__ else None)
    p.add_argument("--pool", metavar="NS/NAME", help="only this pool (default: every pool)")
    p.add_argument("--port-offset", type=int, default=None, metavar="N",
                   help="the local stack's port offset, as in `KINFERENCE_PORT_OFFSET=N make run` "
                        "(default: $KINFERENCE_PORT_OFFSET, else 0)")
    p.add_argument("--nats-url", default=None,
                   help="NATS to follow, or every server of a cluster comma-separated "
                        "(default: the local stack's servers, all three of make run-ha, "
                        "else nats://127.0.0.1:4222 plus the port offset)")
    p.add_argument("-o", "--output", choices=["text", "json"], default="text",
                   help="output format: one line per decision, or its JSON event (default text)")
    p.add_argument("--count", type=int, default=0, metavar="N", help="exit after N events (default: follow)")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for NATS to answer (default 5)")
    natsauth.add_arguments(p, default_user=natsauth.OBSERVER)
    p.set_defaults(run=run)


def format_line(trace: DecisionTrace, now: float | None = None) -> str:
    clock = time.strftime("%H:%M:%S", time.localtime(now or time.time()))
    o = trace.outcome
    sent = o.model if o.model and o.model != trace.model.requested else None
    model = trace.model.requested + (f"->{sent}" if sent else "")
    if o.type == "Routed":
        where = f"{o.backend}" + (f" {o.endpoint}" if o.endpoint else "")
        if o.code:  # a second event of the decision: what the client was answered instead
            where += f" then {o.code}"
    else:
        where = f"Rejected {o.code or ''}".rstrip()
    rule = o.rule or "unmatched"
    tags = ",".join(trace.tags) or "-"
    return (f"{clock} {trace.decision_id[:12]} {trace.pool} tenant={trace.tenant} model={model} "
            f"rule={rule} {where} tags={tags} {trace.decide_us:.0f}us")


async def follow(args: argparse.Namespace) -> int:
    subject = (subjects.decisions_subject(*split_pool(args.pool)) if args.pool
               else f"{subjects.DECISIONS_PREFIX}.>")
    nc = await connect(args)
    # ... but once following, ride out NATS restarts
    nc.options["max_reconnect_attempts"] = -1
    done = asyncio.Event()
    seen = 0

    async def on_msg(msg: Any) -> None:
        nonlocal seen
        if args.output == "json":
            sys.stdout.write(msg.data.decode(errors="replace") + "\n")
        else:
            try:
                sys.stdout.write(format_line(_decoder.decode(msg.data)) + "\n")
            except msgspec.DecodeError:
                sys.stdout.write(f"(unreadable event on {msg.subject})\n")
        sys.stdout.flush()
        seen += 1
        if args.count and seen >= args.count:
            done.set()

    await nc.subscribe(subject, cb=on_msg)
    await bus.sync(nc)
    print(f"following {subject} on {args.nats_url} (Ctrl-C to stop)", file=sys.stderr, flush=True)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, done.set)
    await done.wait()
    await nc.close()
    return EXIT_OK


async def connect(args: argparse.Namespace) -> Any:
    """NATS for a kinfctl command; a CommandError saying which credential is
    missing or refused when NATS is up, or that it cannot be reached."""
    import nats

    errors: list[BaseException] = []

    async def remember(exc: Exception) -> None:
        errors.append(exc)

    try:
        options = natsauth.connect_options(args)
    except natsauth.CredentialsError as exc:
        raise CommandError(str(exc)) from None
    try:
        # fail fast if NATS is not there at all ...
        return await nats.connect(bus.servers(args.nats_url), connect_timeout=args.timeout, max_reconnect_attempts=1,
                                  reconnect_time_wait=0.2, error_cb=remember, **{**bus.KEEPALIVE, **options})
    except Exception as exc:
        offset = getattr(args, "resolved_offset", 0)
        raise CommandError(localstack.why_unreachable(args, offset, exc, errors[-1] if errors else None)) from None


def port_offset(offset: int | None) -> int:
    """``--port-offset``, else ``$KINFERENCE_PORT_OFFSET``, else 0."""
    if offset is None:
        raw = os.environ.get("KINFERENCE_PORT_OFFSET", "0") or "0"
        try:
            offset = int(raw)
        except ValueError:
            raise CommandError(f"KINFERENCE_PORT_OFFSET must be a whole number, not {raw!r}") from None
    return offset


def default_nats_url(offset: int | None) -> str:
    """NATS of a local stack: port 4222 moved by the port offset (``--port-offset``,
    else ``$KINFERENCE_PORT_OFFSET``), as ``make run`` lays its ports out."""
    offset = port_offset(offset)
    if not 0 <= 4222 + offset < 65536:
        raise CommandError(f"port offset {offset} puts NATS outside 1-65535")
    return f"nats://127.0.0.1:{4222 + offset}"


def run(args: argparse.Namespace) -> int:
    if args.pool:
        split_pool(args.pool)  # a malformed --pool is refused before connecting
    local_nats(args)
    return asyncio.run(follow(args))


def local_nats(args: argparse.Namespace) -> None:
    """Without ``--nats-url``: the local stack's NATS, every server of it
    (three for ``make run-ha``), else the default address of the port
    offset. ``--nats-url`` is checked as the services check it (one line
    naming the entry at fault). When NATS is the local stack's, its
    credentials for ``--nats-user`` are found by themselves
    (:mod:`kinfctl.localstack`)."""
    offset = args.resolved_offset = port_offset(args.port_offset)
    if args.nats_url is None:
        run = localstack.find_run_dir(offset)
        servers = localstack.stack_servers(run) if run is not None else []
        args.nats_url = ",".join(servers) if servers else default_nats_url(offset)
    else:
        try:
            args.nats_url = bus.check_url(args.nats_url)
        except bus.NatsUrlError as exc:
            raise CommandError(str(exc)) from None
        run = localstack.stack_of(bus.servers(args.nats_url), offset)
    localstack.fill_credentials(args, run)
