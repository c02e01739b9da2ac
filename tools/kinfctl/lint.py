"""``kinfctl lint FILE|DIR...``: check manifests offline, as the cluster would.

Reads every YAML/JSON document under the paths (``-`` reads standard input),
compiles every policy against the pools in the same input, and prints each
policy's and pool's computed status and every warning. ``-o json`` prints
``{"policies": [...], "pools": [...], "errors": [...], ...}`` where each
``status`` is exactly what the controllers write (the same code computes it).

Exit codes: 0 every manifest valid (warnings never fail the lint); 1 a
manifest (or the command line) is invalid; 2 with ``--strict`` when there are
warnings, or a pool whose status reports a problem (an unresolved destination,
a policyRef to no policy). An unknown field of an InferencePolicy is an error (ignored, it
would change where requests go: in a predicate it widens it); in other
kinds it is a warning (``UnknownField``).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, TextIO

import msgspec

from kinference_common.classifiers import BUILTIN_CLASSIFIERS
from kinference_common.compiler import CompileResult, compile_documents
from kinference_common.manifests import Loaded, load_paths, load_text
from kinfctl.main import EXIT_INVALID, EXIT_OK, CommandError
from kinfctl.output import print_json

EXIT_WARNINGS = 2


def register(sub: Any) -> None:
    p = sub.add_parser(
        "lint",
        help="check manifests offline and print each policy's and pool's status",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("paths", nargs="+", metavar="FILE|DIR", help="manifest files or directories; - for stdin")
    p.add_argument("-o", "--output", choices=["text", "json"], default="text", help="output format (default text)")
    p.add_argument("--strict", action="store_true", help="exit 2 when there are warnings, or a pool with an unresolved destination or missing policy")
    p.add_argument("--in-process-classifier", action="append", dest="in_process", default=[], metavar="NAME",
                   choices=sorted(BUILTIN_CLASSIFIERS),
                   help="as the policy-compiler's flag: the status shows this classifier run in the router's "
                        "process (repeatable)")
    p.set_defaults(run=run)


def read_inputs(paths: list[str]) -> list[Loaded]:
    """Documents from the paths, with ``-`` meaning standard input."""
    loaded: list[Loaded] = []
    files = [p for p in paths if p != "-"]
    if "-" in paths:
        loaded.extend(load_text(sys.stdin.read(), "<stdin>"))
    loaded.extend(load_paths(files))
    return loaded


def run(args: argparse.Namespace) -> int:
    res = compile_documents(read_inputs(args.paths), in_process_classifiers=getattr(args, "in_process", ()))
    # ``objects`` is a defaultdict the compiler reads every kind of: look inside
    if not (any(res.objects.values()) or res.errors):
        raise CommandError("no Kinference manifests found in " + ", ".join(args.paths))
    if args.output == "json":
        print_json(lint_json(res))
    else:
        print_text(res, sys.stdout)
    if res.errors:
        return EXIT_INVALID
    if args.strict and (res.warning_count or pools_with_problems(res)):
        return EXIT_WARNINGS
    return EXIT_OK


def pools_with_problems(res: CompileResult) -> list[tuple[str, str]]:
    """Kinference pools whose status reports a problem as a condition rather
    than a warning (a destination that does not resolve, a policyRef to no
    policy, not Accepted): what ``--strict`` also fails on, as it fails on the
    same faults of an Inference Extension pool, which are warnings."""
    return sorted(key for key, st in res.pool_status.items()
                  if st.unresolved_destinations or any(c.status != "True" for c in st.conditions))


def lint_json(res: CompileResult) -> dict[str, Any]:
    def entries(table: dict[Any, Any]) -> list[dict[str, Any]]:
        return [
            {"namespace": k[-2], "name": k[-1], **({"group": k[0]} if len(k) == 3 else {}),
             "status": msgspec.to_builtins(v)}
            for k, v in sorted(table.items())
        ]

    return {
        "policies": entries(res.policy_status),
        "pools": entries(res.pool_status),
        # Inference Extension pools Kinference serves: Kinference's parents[] entries
        "giePools": entries(res.gie_pool_status),
        "errors": [e.to_dict() for e in res.errors],
        "warnings": msgspec.to_builtins(res.document_warnings),
        "notes": msgspec.to_builtins(res.notes),
        "providers": entries(res.provider_status),
        "objectives": entries(res.objective_status),
        "rewrites": entries(res.rewrite_status),
        "skipped": [{"source": s.document.source, "document": s.document.index, "reason": s.reason}
                    for s in res.skipped],
    }



def _count(n: int, one: str, many: str | None = None) -> str:
    """``1 pool``, ``2 pools``, ``0 policies``."""
    return f"{n} {one if n == 1 else (many or one + 's')}"

def print_text(res: CompileResult, out: TextIO) -> None:
    for (ns, name), st in sorted(res.policy_status.items()):
        refs = f" (referenced by {', '.join(st.referenced_by)})" if st.referenced_by else ""
        out.write(f"InferencePolicy {ns}/{name}: {st.state}, {st.rule_count} rule(s){refs}\n")
        for rule in st.rules:
            if rule.requires_classifiers:
                out.write(
                    f"  rule {rule.name}: asks {', '.join(rule.requires_classifiers)} "
                    f"(adds up to {rule.worst_case_classifier_latency}); can see tags "
                    f"{', '.join(rule.emittable_tags)}\n"
                )
                for c, mode in rule.classifier_failure_mode.items():
                    out.write(f"    {c}: {mode}\n")
            else:
                out.write(f"  rule {rule.name}: no classifier\n")
        for w in st.warnings:
            out.write(f"  warning {w.code} at {w.term}: {w.message}\n")
    for (ns, name), st in sorted(res.pool_status.items()):
        pool = res.objects["InferencePool"][(ns, name)].obj
        ref = pool.spec.policy_ref  # type: ignore[union-attr]
        ref_name = (ref[0].name if ref else "") if isinstance(ref, list) else (ref.name if ref else "")
        out.write(
            f"InferencePool {ns}/{name}: {st.state}, {st.destination_count} destination(s), "
            f"policy {ref_name or '(default)'}\n"
        )
        for u in st.unresolved_destinations:
            what = u.name or (f"selector {u.selector}" if u.selector else "(unnamed)")
            out.write(f"  unresolved {u.kind or '(no kind)'} {what}: {u.reason}: {u.message}\n")
        for m in st.models:
            window = ""
            if m.context_window:
                lo, hi = m.context_window["min"], m.context_window["max"]
                window = f", context {lo}" if lo == hi else f", context {lo}..{hi}"
            aliases = f" (aliases {', '.join(m.aliases)})" if m.aliases else ""
            out.write(f"  model {m.name}{aliases}: served by {', '.join(m.served_by)}{window}\n")
        for c in st.conditions:
            if c.status != "True":
                out.write(f"  condition {c.type}=False ({c.reason}): {c.message}\n")
    for (ns, name), gst in sorted(res.gie_pool_status.items()):
        compiled = res.pools[(ns, name)]
        out.write(f"InferencePool.inference.networking.k8s.io {ns}/{name}: {len(compiled.destinations)} "
                  f"destination(s), policy {compiled.policy.name or '(default)'}\n")
        for m in compiled.models:
            out.write(f"  model {m.name}: served by {', '.join(m.served_by)}\n")
        for parent in gst.parents:
            conds = ", ".join(f"{c.type}={c.status} ({c.reason})" for c in parent.conditions)
            out.write(f"  parent {parent.parent_ref.kind} {parent.parent_ref.namespace}/{parent.parent_ref.name} "
                      f"({parent.controller_name}): {conds}\n")
    for table, kind in ((res.objective_status, "InferenceObjective"), (res.rewrite_status, "InferenceModelRewrite")):
        for (group, ns, name), st in sorted(table.items()):
            for c in st.conditions:
                if c.status != "True":
                    out.write(f"{kind} {ns}/{name} ({group}): Accepted=False ({c.reason}): {c.message}\n")
    for w in res.document_warnings:
        what = f"{w.kind} {w.namespace}/{w.name}"
        out.write(f"warning {w.code}: {f'{w.source} ({what})' if w.source else what} at {w.path}: {w.message}\n")
    for w in res.notes:
        out.write(f"note {w.code}: {w.kind} {w.namespace}/{w.name}: {w.message}\n")
    for e in res.errors:
        out.write(f"error: {e}\n")
    n_pol, n_pool = len(res.policy_status), len(res.pool_status) + len(res.gie_pool_status)
    bad = pools_with_problems(res)
    out.write(
        f"{_count(n_pol, 'policy', 'policies')}, {_count(n_pool, 'pool')}: "
        f"{_count(len(res.errors), 'error')}, {_count(res.warning_count, 'warning')}"
        + (f", {_count(len(bad), 'pool')} with problems ({', '.join(f'{n}/{m}' for n, m in bad)})" if bad else "")
        + "\n"
    )
