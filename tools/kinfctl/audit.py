"""``kinfctl audit --since 1h`` or ``kinfctl audit FILE``: the PII record an
auditor asks for, from the routers' decision records (``--since``: the
JetStream stream the routers record to; as ``kinfctl replay`` reads it) or
from a file of decision events (one JSON object per line, as ``kinfctl
events -o json`` prints them, or records written by ``kinfctl replay
--export``).

Every request that carried a PII tag (``pii-confirmed`` or ``pii-unknown``),
by tenant and rule: how many were kept local, refused, or sent to a provider
(this must be 0, and is shouted otherwise), and how many carried
``pii-unknown`` because the classifier failed (it failed closed). Never the
text: decision events carry none. Exit code 1 when any PII-tagged request
left the cluster.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgspec

from kinference_common import recording
from kinference_common.engine.trace import DecisionTrace, ModelTrace
from kinference_common.recording import DecisionRecord
from kinfctl.main import EXIT_OK, CommandError, split_pool
from kinfctl.output import print_json, table
from kinfctl.records import add_nats_arguments

PII_TAGS = frozenset({"pii-confirmed", "pii-unknown"})
_decoder = msgspec.json.Decoder(DecisionTrace)


def register(sub: Any) -> None:
    p = sub.add_parser("audit", help="every PII-tagged request and what the policy did with it",
                       description=__doc__.split("\n\n", 1)[1] if __doc__ else None)
    p.add_argument("file", type=Path, nargs="?",
                   help="decision events or exported records, one JSON object per line (- for stdin); "
                        "without it, the recorded decisions of --since from NATS")
    p.add_argument("--pool", metavar="NS/NAME", help="only this pool")
    p.add_argument("--since", metavar="AGE",
                   help="the recorded decisions of the last AGE from NATS, a duration such as 1h (default 1h "
                        "when no FILE is given)")
    add_nats_arguments(p)
    p.add_argument("-o", "--output", choices=["text", "json"], default="text", help="output format (default text)")
    p.set_defaults(run=run)


def _where(t: DecisionTrace) -> str:
    if t.outcome.type != "Routed":
        return "refused"
    return "provider" if (t.outcome.backend or "").startswith("Provider/") else "local"


def audit(traces: Iterable[DecisionTrace]) -> dict[str, Any]:
    """Counts by (tenant, rule) of the PII-tagged decisions."""
    rows: dict[tuple[str, str], dict[str, int]] = {}
    total = {"requests": 0, "pii": 0, "local": 0, "refused": 0, "provider": 0, "failed_closed": 0}
    for t in traces:
        total["requests"] += 1
        if not PII_TAGS & set(t.tags):
            continue
        key = (t.tenant, t.outcome.rule or "unmatched")
        row = rows.setdefault(key, {"pii": 0, "local": 0, "refused": 0, "provider": 0, "failed_closed": 0})
        where = _where(t)
        failed = any(c.name == "pii" and c.outcome not in ("ok", "skipped") for c in t.classifiers)
        for d in (row, total):
            d["pii"] += 1
            d[where] += 1
            d["failed_closed"] += failed
    return {"total": total,
            "by": [{"tenant": k[0], "rule": k[1], **v} for k, v in sorted(rows.items())]}


def read(path: Path, pool: str | None) -> list[DecisionTrace]:
    try:
        lines = sys.stdin.read().splitlines() if str(path) == "-" else path.read_text().splitlines()
    except OSError as exc:
        raise CommandError(f"{path}: {exc.strerror or exc}") from None
    out = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            if line.lstrip().startswith('{"kind"'):  # a record of kinfctl replay --export
                rec = recording.decode(line)
                if not isinstance(rec, DecisionRecord):
                    continue
                t = as_trace(rec)
            else:
                t = _decoder.decode(line)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise CommandError(f"{path}:{n}: not a decision event: {exc}") from None
        if pool is None or t.pool == pool:
            out.append(t)
    return out


def as_trace(rec: DecisionRecord) -> DecisionTrace:
    """The parts of a decision event a record holds."""
    q = rec.request
    requested = q.requested_model or q.model
    return DecisionTrace(decision_id=rec.decision_id, pool=f"{rec.namespace}/{rec.pool}", tenant=q.tenant,
                         model=ModelTrace(requested=requested, rewritten=q.model if q.model != requested else None,
                                          canonical=q.model),
                         tags=q.tags, classifiers=rec.classifiers, outcome=rec.outcome, decide_us=0.0)


def from_records(args: argparse.Namespace) -> list[DecisionTrace]:
    from kinfctl import records

    since = records.since_seconds(args.since or "1h")
    ns = name = None
    if args.pool:
        ns, name = split_pool(args.pool)
    got = records.from_nats(args, ns, name, since, snapshots=False)
    # a failed send is recorded twice: the decision, then what the client saw (the last counts)
    last = {r.decision_id: r for r in got if isinstance(r, DecisionRecord)}
    return [as_trace(r) for r in last.values()]


def run(args: argparse.Namespace) -> int:
    if args.file is not None and args.since is not None:
        raise CommandError("give FILE or --since, not both")
    pool = "/".join(split_pool(args.pool)) if args.pool else None
    traces = read(args.file, pool) if args.file is not None else from_records(args)
    result = audit(traces)
    total = result["total"]
    if args.output == "json":
        print_json(result)
    else:
        cols = ("pii", "local", "refused", "provider", "failed_closed")
        table(["TENANT", "RULE", "PII", "LOCAL", "REFUSED", "PROVIDER", "FAILED-CLOSED"],
              [[r["tenant"], r["rule"], *(str(r[c]) for c in cols)] for r in result["by"]])
        print(f"{total['pii']} of {total['requests']} requests carried a PII tag: {total['local']} kept local, "
              f"{total['refused']} refused, {total['provider']} sent to a provider; "
              f"{total['failed_closed']} because the classifier failed (failed closed)")
    if total["provider"]:
        print(f"PII LEFT THE CLUSTER: {total['provider']} PII-tagged request(s) went to a provider", file=sys.stderr)
        return 1
    return EXIT_OK
