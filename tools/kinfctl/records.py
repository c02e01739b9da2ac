"""Reading the routers' decision records (:mod:`kinference_common.recording`):
from the JetStream stream (the local stack's NATS by default, its observer
credentials found as ``kinfctl events`` finds them) or from a file written by
``kinfctl replay --export`` (one record a line, JSON).

Shared by ``kinfctl replay`` and ``kinfctl audit --since``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import sys
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec

from kinference_common import bus, natsauth, recording
from kinference_common.durations import DurationError, parse_duration
from kinference_common.recording import DecisionRecord, Record, SnapshotRecord
from kinfctl import events
from kinfctl.main import CommandError

#: snapshot records are read from this long before ``--since``: the routers'
#: ``--record-keyframe-interval`` (60 s by default) must not be longer
SNAPSHOT_MARGIN_SECONDS = 300.0


def add_source_arguments(p: Any, *, file_help: str) -> None:
    """``--since``, ``--file`` and the NATS flags ``kinfctl events`` has."""
    p.add_argument("--since", default="1h", metavar="AGE",
                   help="records of the last AGE, a duration such as 30m, 1h, 24h (default 1h)")
    p.add_argument("--file", type=Path, metavar="EXPORT", help=file_help)
    add_nats_arguments(p)


def add_nats_arguments(p: Any) -> None:
    """Where the records are: the NATS flags (as the observer) ``kinfctl audit`` shares."""
    p.add_argument("--port-offset", type=int, default=None, metavar="N",
                   help="the local stack's port offset, as in `KINFERENCE_PORT_OFFSET=N make run` "
                        "(default: $KINFERENCE_PORT_OFFSET, else 0)")
    p.add_argument("--nats-url", default=None,
                   help="NATS holding the records, or every server of a cluster comma-separated (default: the "
                        "local stack's servers, all three of make run-ha, else nats://127.0.0.1:4222 plus "
                        "the port offset)")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for NATS to answer (default 5)")
    natsauth.add_arguments(p, default_user=natsauth.OBSERVER)


def since_seconds(text: str) -> float:
    try:
        seconds = parse_duration(text)
    except DurationError as exc:
        raise CommandError(f"--since: {exc}") from None
    if seconds <= 0:
        raise CommandError(f"--since must be a positive duration, not {text!r}")
    return seconds


def read_file(path: Path) -> list[Record]:
    """Records from an export file (``-``: standard input)."""
    try:
        text = sys.stdin.read() if str(path) == "-" else path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CommandError(f"{path}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    out: list[Record] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append(recording.decode(line))
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise CommandError(f"{path}:{n}: not a decision record (written by `kinfctl replay --export`): "
                               f"{exc}") from None
    return out


def write_file(path: Path, records: Iterable[Record]) -> int:
    n = 0
    try:
        with (sys.stdout if str(path) == "-" else path.open("w", encoding="utf-8")) as f:
            for rec in records:
                f.write(recording.encode(rec).decode() + "\n")
                n += 1
    except OSError as exc:
        raise CommandError(f"{path}: cannot write: {exc.strerror or exc}") from None
    return n


#: the exit code of ``kinfctl audit`` and ``replay`` when the records cannot be read (NATS
#: unreachable or not answering): 1 means PII left (or would leave) the cluster, and a script
#: must not take an outage for that, nor for "nothing left"
EXIT_UNREADABLE = 3


async def _fetch(args: argparse.Namespace, subject: str, start: float) -> list[Record]:
    """Every record on ``subject`` stored since ``start`` (wall clock), in order."""
    try:
        return await _fetch_from(args, subject, start)
    except CommandError:
        raise
    except Exception as exc:  # NATS in between two servers, a timeout: one line, never a traceback
        raise CommandError(f"cannot read the decision records on {args.nats_url}: {bus.describe(exc)} "
                           "(a NATS server of a cluster just went away? try again in a few seconds)",
                           code=EXIT_UNREADABLE) from None


async def _fetch_from(args: argparse.Namespace, subject: str, start: float) -> list[Record]:
    from nats.js.api import ConsumerConfig, DeliverPolicy
    from nats.js.errors import NotFoundError

    try:
        nc = await events.connect(args)
    except CommandError as exc:  # NATS unreachable
        raise CommandError(str(exc), code=EXIT_UNREADABLE) from None
    try:
        js = nc.jetstream()
        try:
            info = await js.stream_info(recording.STREAM)
        except NotFoundError:
            raise CommandError(f"no decision records on {args.nats_url}: the stream {recording.STREAM} does "
                               "not exist (routers record unless started with --no-record)") from None
        except Exception as exc:
            raise CommandError(f"cannot read the stream {recording.STREAM} on {args.nats_url}: "
                               f"{type(exc).__name__} {exc}".rstrip(), code=EXIT_UNREADABLE) from None
        if not info.state.messages:
            return []
        config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_TIME,
                                opt_start_time=datetime.fromtimestamp(start, UTC).isoformat().replace("+00:00", "Z"))
        sub = await js.subscribe(subject, stream=recording.STREAM, ordered_consumer=True, config=config)
        out: list[Record] = []
        # a router sends again the records its stream may have missed while it had
        # no leader (a NATS server of a cluster died): some are stored twice
        seen: set[bytes] = set()
        try:
            ci = await sub.consumer_info()
            # pushed already (delivered) or still to come (pending): anything at all?
            pending = ci.num_pending + (ci.delivered.consumer_seq if ci.delivered else 0)
            while pending:
                msg = await sub.next_msg(timeout=args.timeout)
                pending = msg.metadata.num_pending
                digest = hashlib.blake2b(msg.data, digest_size=16).digest()
                if digest in seen:
                    continue
                seen.add(digest)
                try:
                    out.append(recording.decode(msg.data))
                except (msgspec.DecodeError, msgspec.ValidationError):
                    pass  # a newer or damaged record: not ours to read
        except TimeoutError:
            raise CommandError(f"the stream {recording.STREAM} stopped answering after {len(out)} records",
                               code=EXIT_UNREADABLE) from None
        finally:
            await sub.unsubscribe()
        return out
    finally:
        await nc.close()


def from_nats(args: argparse.Namespace, namespace: str | None, pool: str | None, since: float,
              snapshots: bool = True) -> list[Record]:
    """The records of one pool (every pool: ``namespace`` None) of the last
    ``since`` seconds, and the snapshot records those need (read from
    :data:`SNAPSHOT_MARGIN_SECONDS` earlier); sorted as stored."""
    events.local_nats(args)
    if namespace is not None and pool is not None:
        subject = recording.pool_filter(namespace, pool)
    else:
        subject = f"{recording.PREFIX}.>"
    if not snapshots:  # decisions only (kinfctl audit)
        subject = (recording.subject(namespace, pool, "decision") if namespace is not None and pool is not None
                   else f"{recording.PREFIX}.*.*.decision")
    start = time.time() - since - (SNAPSHOT_MARGIN_SECONDS if snapshots else 0.0)
    got = asyncio.run(_fetch(args, subject, start))
    cut = time.time() - since
    return [r for r in got if isinstance(r, SnapshotRecord) or getattr(r, "at", cut) >= cut]


async def _recorded_pools(args: argparse.Namespace) -> list[str]:
    nc = await events.connect(args)
    try:
        try:
            info = await nc.jetstream().stream_info(recording.STREAM,
                                                    subjects_filter=f"{recording.PREFIX}.*.*.decision")
        except Exception:  # no stream, no JetStream: nothing to name
            return []
        # kinference.record.<namespace>.<pool>.decision
        return sorted({"/".join(s.split(".")[2:4]) for s in (info.state.subjects or {})})
    finally:
        await nc.close()


def recorded_pools(args: argparse.Namespace) -> list[str]:
    """The pools with decision records in the stream (any age it keeps): a
    read of one pool's subject finds only that pool's."""
    events.local_nats(args)
    return asyncio.run(_recorded_pools(args))


def pools_in(records: Iterable[Record]) -> list[str]:
    return sorted({f"{r.namespace}/{r.pool}" for r in records if isinstance(r, DecisionRecord)})
