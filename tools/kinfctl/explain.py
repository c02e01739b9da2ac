"""``kinfctl explain``: the routing decision for one request, offline.

Compiles the manifests (``-f``, repeatable; ``-`` reads standard input),
takes the pool's endpoint and provider state from ``--telemetry`` and runs the
router's own decision engine on the request body, printing the decision
trace: the answer first, then the path (every rule tried, the candidates each
exclusion dropped, each tier's survivors, the pick and why, and each
candidate's PredictedTTFT). ``-o json`` prints the trace exactly as
``/debug/explain`` returns it.

No classifier runs offline: ``--tag`` sets the request's tags as if
classifiers had emitted them; a classifier the request needs with no
``--tag`` of its own counts as failed, so its failure tag is set.

STATE.yaml::

  endpoints:
    - {namespace: default, workerSet: qwen-2-5-32b, pod: qwen-0, ready: true,
       queuedPrompts: 3, runningPrompts: 40, kvCacheUsage: 0.6,
       prefillTokensPerSecond: 12000, ageSeconds: 0.1}
  providers:
    - {namespace: default, name: databricks, estimatedTTFT: 0.9, errorRate: 0}

Endpoints also accept ``gpuUtilization``, ``gpuMemoryUsage``,
``prefixCacheHitRate``, ``fixedOverheadSeconds``, ``contextWindow``,
``kvCapacityTokens``, ``ejected`` (this router ejected it) and ``inFlight``
(requests this router has open to it). ``estimatedTTFT`` is seconds or a
duration such as ``900ms``.

Exit 0 whatever the decision; 1 when the input is invalid.
"""

from __future__ import annotations

import argparse
import random
import re
import sys
import time
import uuid
from pathlib import Path
from typing import Any, TextIO

import msgspec
import yaml
from kinference_common.classifiers import BUILTIN_CLASSIFIERS, classifier_for_prefix, given_tags
from kinference_common.compiler import compile_documents
from kinference_common.durations import DurationError, format_duration, parse_duration
from kinference_common.engine import InFlightLedger, Snapshot, decide, interpret, rejection_status
from kinference_common.engine.request import engine_request
from kinference_common.engine.trace import ClassifierTrace, DecisionTrace, RuleTrace
from kinference_common.manifests import Loaded, closest, load_paths, load_text, split_validation_error
from kinference_common.messages import EndpointState, ProviderState
from kinference_common.request_body import BadRequest, ParsedBody, check_body, decode, parse, reads_as_chat

from kinfctl.main import EXIT_OK, CommandError, split_pool
from kinfctl.output import print_json


# ---------------------------------------------------------------- telemetry


class _State(msgspec.Struct, forbid_unknown_fields=True, rename="camel", kw_only=True):
    pass


class EndpointEntry(_State, kw_only=True):
    namespace: str = "default"
    worker_set: str
    pod: str
    ready: bool = True
    queued_prompts: int | None = None
    running_prompts: int | None = None
    kv_cache_usage: float | None = None
    gpu_utilization: float | None = None
    gpu_memory_usage: float | None = None
    prefill_tokens_per_second: float | None = None
    fixed_overhead_seconds: float | None = None
    prefix_cache_hit_rate: float | None = None
    context_window: int | None = None
    kv_capacity_tokens: int | None = None
    age_seconds: float = 0.0
    ejected: bool = False
    in_flight: int = 0
    address: str = ""


class ProviderEntry(_State, kw_only=True):
    namespace: str = "default"
    name: str
    estimated_ttft: float | str | None = msgspec.field(default=None, name="estimatedTTFT")
    error_rate: float | None = None
    in_flight: int = 0


class TelemetryFile(_State, kw_only=True):
    endpoints: list[EndpointEntry] = []
    providers: list[ProviderEntry] = []


def _telemetry_error(text: str) -> str:
    """msgspec's words, read as lint reads a manifest's: the field's path,
    and the field meant for one it does not know."""
    where, message = split_validation_error(text)
    unknown = re.match(r"Object contains unknown field `([^`]*)`$", message)
    if unknown:
        entry = {"endpoints": EndpointEntry, "providers": ProviderEntry}.get(where.split("[", 1)[0], TelemetryFile)
        fields = [f.encode_name for f in msgspec.structs.fields(entry)]
        guess = closest(unknown.group(1), fields)
        hint = f"did you mean `{guess}`?" if guess else f"its fields: {', '.join(fields)}"
        return f"{where + '.' if where else ''}{unknown.group(1)} is not a field ({hint})"
    message = re.sub(r"Expected `([^`]*)`, got `([^`]*)`", r"expected \1, got \2", message)
    message = message.replace("Object missing required field", "missing required field")
    return f"{where}: {message}" if where else message


def load_telemetry(path: str) -> TelemetryFile:
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise CommandError(f"--telemetry {path}: cannot read: {exc.strerror or exc}") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CommandError(f"--telemetry {path}: not valid YAML: {str(exc).splitlines()[0]}") from None
    if raw is None:
        raw = {}
    try:
        state = msgspec.convert(raw, TelemetryFile, strict=False)
    except msgspec.ValidationError as exc:
        raise CommandError(f"--telemetry {path}: {_telemetry_error(str(exc))}") from None
    for i, p in enumerate(state.providers):
        if isinstance(p.estimated_ttft, str):
            try:
                p.estimated_ttft = parse_duration(p.estimated_ttft)
            except DurationError as exc:
                raise CommandError(f"--telemetry {path}: providers[{i}].estimatedTTFT: {exc}") from None
    return state


def telemetry_states(
    state: TelemetryFile, now: float
) -> tuple[list[EndpointState], list[ProviderState], set[str], InFlightLedger]:
    """Engine-facing telemetry, the ejection set and a ledger holding ``inFlight``."""
    endpoints = [
        EndpointState(
            namespace=e.namespace, worker_set=e.worker_set, pod=e.pod, address=e.address,
            ready=e.ready, scraped_at=now - e.age_seconds, queued=e.queued_prompts,
            running=e.running_prompts, kv_cache_usage=e.kv_cache_usage,
            gpu_utilization=e.gpu_utilization, gpu_memory_usage=e.gpu_memory_usage,
            prefill_tokens_per_second=e.prefill_tokens_per_second,
            fixed_overhead_seconds=e.fixed_overhead_seconds,
            prefix_cache_hit_rate=e.prefix_cache_hit_rate, context_window=e.context_window,
            kv_capacity_tokens=e.kv_capacity_tokens,
        )
        for e in state.endpoints
    ]
    providers = [
        ProviderState(
            namespace=p.namespace, name=p.name,
            estimated_ttft_seconds=p.estimated_ttft,  # type: ignore[arg-type]
            error_rate=p.error_rate, observations=0 if p.estimated_ttft is None else 1, updated_at=now,
        )
        for p in state.providers
    ]
    ejected = {f"{e.namespace}/{e.worker_set}/{e.pod}" for e in state.endpoints if e.ejected}
    ledger = InFlightLedger()
    for key, n in [(f"{e.namespace}/{e.worker_set}/{e.pod}", e.in_flight) for e in state.endpoints] + [
        (f"{p.namespace}/{p.name}", p.in_flight) for p in state.providers
    ]:
        for _ in range(n):
            send = ledger.sent(key, 0, now - 1)
            ledger.first_token(send)  # decoding: open, but no longer queued for prefill
    return endpoints, providers, ejected, ledger


# ------------------------------------------------------------------ request


def load_body(path: str) -> ParsedBody:
    """The request body, read and checked as the router's data port reads it
    (a completions body has a ``prompt`` and no ``messages``; anything else
    is read as a chat body): CommandError with the data port's words."""
    try:
        data = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except OSError as exc:
        raise CommandError(f"--request {path}: cannot read: {exc.strerror or exc}") from None
    try:
        body = parse(data, chat=reads_as_chat(decode(data)))
        check_body(body)
    except BadRequest as exc:
        raise CommandError(f"--request {path}: {exc}") from None
    return body


def parse_headers(items: list[str]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise CommandError(f"--header {item!r}: expected NAME=VALUE")
        headers[name.strip().lower()] = value
    return headers


# ---------------------------------------------------------------------- run


def register(sub: Any) -> None:
    p = sub.add_parser(
        "explain",
        help="explain the routing decision for one request, offline",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("-f", "--filename", action="append", required=True, metavar="MANIFESTS",
                   help="manifest file or directory (repeatable; - for stdin)")
    p.add_argument("--pool", required=True, metavar="NS/NAME", help="the InferencePool (NAME alone: default/NAME)")
    p.add_argument("--telemetry", required=True, metavar="STATE.yaml", help="endpoint and provider state")
    p.add_argument("--request", required=True, metavar="BODY.json", help="the OpenAI request body")
    p.add_argument("--tenant", default="anonymous", help="the caller's tenant (default anonymous)")
    p.add_argument("--tag", action="append", default=[], metavar="TAG",
                   help="a tag as if a classifier emitted it (repeatable)")
    p.add_argument("--header", action="append", default=[], metavar="K=V", help="a request header (repeatable)")
    p.add_argument("-o", "--output", choices=["text", "json"], default="text", help="output format (default text)")
    p.set_defaults(run=run)


def _read_manifests(paths: list[str]) -> list[Loaded]:
    loaded: list[Loaded] = []
    if "-" in paths:
        loaded.extend(load_text(sys.stdin.read(), "<stdin>"))
    loaded.extend(load_paths([p for p in paths if p != "-"]))
    return loaded


def explain(args: argparse.Namespace, now: float | None = None) -> DecisionTrace:
    """The trace for the command line ``args`` (raises CommandError on bad input)."""
    if sum(x == "-" for x in [*args.filename, args.telemetry, args.request]) > 1:
        raise CommandError("only one of -f, --telemetry and --request can read standard input")
    ns, name = split_pool(args.pool)
    res = compile_documents(_read_manifests(args.filename))
    if res.errors:
        more = f" (and {len(res.errors) - 1} more; run kinfctl lint)" if len(res.errors) > 1 else ""
        raise CommandError(f"{res.errors[0]}{more}")
    pool = res.pools.get((ns, name))
    if pool is None:
        known = ", ".join(f"{k[0]}/{k[1]}" for k in sorted(res.pools)) or "none"
        raise CommandError(f"pool {ns}/{name} is not in the manifests (pools: {known})")
    headers = parse_headers(args.header)
    body = load_body(args.request)
    telemetry = load_telemetry(args.telemetry)
    try:
        given = given_tags(args.tag)
    except ValueError as exc:
        raise CommandError(f"--tag {exc}") from None
    _note_foreign_telemetry(telemetry, pool, args.telemetry)

    now = time.time() if now is None else now
    endpoints, providers, ejected, ledger = telemetry_states(telemetry, now)
    rng = random.Random(0)  # deterministic offline: same input, same answer
    snapshot = Snapshot(pool, endpoints, providers, now=now, ejected=ejected, rng=rng)

    # the router's own construction: rewrite, objective, prompt estimate, block hashes
    request = engine_request(snapshot, headers, body, args.tenant, rng)

    # classifiers: --tag stands for what they emitted; a needed one without
    # a tag of its own failed, and emits its failure tag
    tags = set(args.tag)
    classifiers: list[ClassifierTrace] = []
    for cname in snapshot.classifiers_for(request):
        info = BUILTIN_CLASSIFIERS[cname]
        own = [t for t in tags if (c := classifier_for_prefix(t)) is not None and c.name == cname]
        if own:
            classifiers.append(ClassifierTrace(name=cname, ms=0.0, outcome="offline", tags=sorted(own)))
        else:
            tags.add(info.failure_tag)
            classifiers.append(ClassifierTrace(name=cname, ms=0.0, outcome="absent", tags=[info.failure_tag]))
    request = msgspec.structs.replace(request, tags=frozenset(tags))

    decision = interpret(decide(snapshot, request, ledger=ledger))  # as the data port answers
    return decision.trace(decision_id=f"explain-{uuid.uuid4().hex[:12]}", classifiers=classifiers)


def _note_foreign_telemetry(state: TelemetryFile, pool: Any, path: str) -> None:
    """Say (on stderr) which telemetry entries the pool has no destination
    for: they take no part in the decision (a misspelt workerSet would
    otherwise look like a pod that is not there)."""
    local = {(d.namespace, d.name) for d in pool.destinations if d.type == "Local"}
    remote = {(d.namespace, d.name) for d in pool.destinations if d.type == "Provider"}
    for what, entries, known in (("endpoints", [(e.namespace, e.worker_set) for e in state.endpoints], local),
                                 ("providers", [(p.namespace, p.name) for p in state.providers], remote)):
        for i, key in enumerate(entries):
            if key not in known:
                names = ", ".join(f"{n}/{m}" for n, m in sorted(known)) or "none"
                kind = "worker set" if what == "endpoints" else "provider"
                sys.stderr.write(f"note: --telemetry {path}: {what}[{i}] names {kind} {key[0]}/{key[1]}, which "
                                 f"pool {pool.namespace}/{pool.name} does not have ({names}): left out\n")


def run(args: argparse.Namespace) -> int:
    trace = explain(args)
    if args.output == "json":
        print_json(trace, sys.stdout)
    else:
        render_text(trace, sys.stdout)
    return EXIT_OK


# --------------------------------------------------------------------- text


def _ms(v: float | None) -> str:
    return "-" if v is None else format_duration(v / 1e3)


def _list(ids: list[str], limit: int = 8) -> str:
    if not ids:
        return "none"
    shown = ", ".join(ids[:limit])
    return shown + (f" (+{len(ids) - limit} more)" if len(ids) > limit else "")


def render_text(t: DecisionTrace, out: TextIO) -> None:
    """For people: the answer first, then the path."""
    o = t.outcome
    if o.type == "Routed":
        where = o.backend + (f" (pod {o.endpoint})" if o.endpoint else "")
        out.write(f"Routed to {where}, model {o.model!r}, by rule {o.rule}\n")
    else:
        status = rejection_status(o.code)
        out.write(f"Rejected: {o.code} (HTTP {status})" + (f", by rule {o.rule}" if o.rule else "") + "\n")
    out.write(f"  {o.reason}\n")
    out.write(f"  decided in {t.decide_us:.0f} us\n\n")

    m = t.model
    model = m.requested
    if m.rewritten:
        model += f" -> {m.rewritten} (InferenceModelRewrite)"
    if m.canonical not in (m.requested, m.rewritten):
        model += f" = {m.canonical}"
    out.write(f"request: pool {t.pool}, tenant {t.tenant}, model {model}\n")
    out.write(f"  tags: {', '.join(t.tags) or 'none'}\n")
    for c in t.classifiers:
        what = "failed (no --tag): failure tag set" if c.outcome == "absent" else c.outcome
        out.write(f"  classifier {c.name}: {what}\n")
    for r in t.rules:
        out.write("\n")
        _render_rule(r, out)


def _render_rule(r: RuleTrace, out: TextIO) -> None:
    if not r.matched:
        why = "shadowed (follows a catch-all that rejects)" if r.outcome == "Shadowed" else "matches do not hold"
        out.write(f"rule {r.name}: skipped, {why}\n")
        return
    out.write(f"rule {r.name}: {r.outcome}\n")
    for b in r.builtin:
        verb = "marked" if not b.removed else "removed"
        out.write(f"  built-in {b.check}: {verb} {_list(b.candidates)}\n")
    out.write(f"  candidates ({len(r.candidates)}): {_list(r.candidates)}\n")
    for e in r.excluded:
        if not e.applies:
            out.write(f"  exclude {e.exclusion}: its if does not hold\n")
        else:
            out.write(f"  exclude {e.exclusion}: dropped {_list(e.dropped)}\n")
    for tr in r.tiers:
        line = f"  tier {tr.index} ({tr.type}): kept {len(tr.kept)}"
        if tr.picked:
            line += f", picked {tr.picked}: {tr.why}"
        else:
            line += f" - {tr.why}"
        out.write(line + "\n")
    if r.scores:
        out.write("  candidate scores:\n")
        rows = [("CANDIDATE", "PREDICTED", "ESTIMATED", "QUEUED", "RUNNING", "KV", "INFLIGHT", "PREFIX", "")]
        for s in r.scores[:50]:
            rows.append((
                s.candidate, _ms(s.predicted_ttft_ms), _ms(s.estimated_ttft_ms),
                "-" if s.queued_prompts is None else str(s.queued_prompts),
                "-" if s.running_prompts is None else str(s.running_prompts),
                "-" if s.kv_cache_usage is None else f"{s.kv_cache_usage:.2f}",
                str(s.in_flight), str(s.prefix_blocks), "stale" if s.stale else "",
            ))
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        for row in rows:
            out.write("    " + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() + "\n")
        if len(r.scores) > 50:
            out.write(f"    ... {len(r.scores) - 50} more (-o json lists all)\n")
