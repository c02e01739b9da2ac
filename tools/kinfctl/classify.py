"""``kinfctl classify``: run a built-in classifier on prompts read from stdin.

Each stdin line is a JSON object: ``{"id": ..., "text": "..."}``, or an
OpenAI-style body (``{"id": ..., "messages": [...]}`` or ``"prompt"``) read
exactly as the router would. One line is written per input line:
``{"id", "tags", "micros"}`` with ``-o json`` (plus ``outcome`` and
``findings``), or ``ID  TAG  MICROS`` as text. ``--explain`` (pii) adds what was found
and why: each candidate judged confirmed or unknown as ``kind``, the ``rule`` that found it,
its verdict and the character offsets of the match the rule fired on (for free-text
rules, the cue: "Dear", "born", the house number) (``found`` in JSON; a fourth column
``kind/rule@text:start-end`` as text). The span's text is never printed. The classification is the
service's own code (:class:`kinference_common.detectors.core.Classifiers`), run
in-process: no NATS, no cluster.

A line that is not a JSON object is reported on stderr with its line number;
the other lines are still classified and the exit code is 1.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import msgspec

from kinfctl.main import EXIT_INVALID, EXIT_OK

_decode = msgspec.json.Decoder(dict[str, Any])
_encode = msgspec.json.Encoder()


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "classify",
        help="classify prompts from stdin (JSON lines) with a built-in classifier",
        description=(
            'Read JSON lines {"id", "text"} (or chat/completions bodies with "messages" or '
            '"prompt") on stdin; write one line per input with the tag and the time taken, '
            "using the classifier service's code in-process."
        ),
    )
    p.add_argument(
        "--classifier",
        choices=("pii", "injection"),
        default="pii",
        help="which classifier (default: pii)",
    )
    p.add_argument("-o", "--output", choices=("text", "json"), default="text", help="output format (default text)")
    p.add_argument(
        "--engine",
        choices=("auto", "hyperscan", "re"),
        default="auto",
        help="candidate engine (default: hyperscan when available)",
    )
    p.add_argument(
        "--explain",
        action="store_true",
        help="pii: list each candidate found (kind, rule, verdict, offsets; never its text)",
    )
    p.set_defaults(run=run)


_VERDICT = {"POSITIVE": "confirmed", "UNKNOWN": "unknown", "NONE": "none"}


def _explain(classifiers: Any, texts: list[str]) -> list[dict[str, Any]]:
    from kinference_common.detectors.pii import explain

    detector = classifiers.detectors["pii"]
    return [
        {"kind": kind, "rule": rule, "verdict": _VERDICT[verdict.name], "text": i, "start": start, "end": end}
        for i, kind, rule, start, end, verdict in explain(detector, texts)
    ]


def run(args: argparse.Namespace) -> int:
    from kinference_common.detectors.core import Classifiers
    from kinference_common.prompt_texts import texts_from_body

    classifiers = Classifiers(engine=args.engine)
    classifiers.warm_up()
    out = sys.stdout
    code = EXIT_OK
    for lineno, line in enumerate(sys.stdin, 1):
        if not line.strip():
            continue
        try:
            obj = _decode.decode(line)
        except msgspec.DecodeError as exc:
            print(f"kinfctl: line {lineno}: not a JSON object: {exc}", file=sys.stderr)
            code = EXIT_INVALID
            continue
        ident = obj.get("id", lineno)
        if "messages" in obj or "prompt" in obj:
            extracted = texts_from_body(obj)
            texts, roles, unreadable = extracted.texts, extracted.roles, extracted.unreadable
        elif isinstance(obj.get("text"), str):
            texts, roles, unreadable = [obj["text"]], [""], 0
        else:
            print(f'kinfctl: line {lineno}: needs "text", "messages" or "prompt"', file=sys.stderr)
            code = EXIT_INVALID
            continue
        reply = classifiers.classify(args.classifier, texts, roles=roles, unreadable=unreadable)
        found = _explain(classifiers, texts) if args.explain and args.classifier == "pii" else None
        if args.output == "json":
            record = {
                "id": ident,
                "tags": reply.tags,
                "micros": reply.micros,
                "outcome": reply.outcome,
                "findings": reply.findings,
            }
            if found is not None:
                record["found"] = found
            out.write(_encode.encode(record).decode() + "\n")
        else:
            line = f"{ident}\t{','.join(reply.tags)}\t{reply.micros:.0f}us"
            if found is not None:
                line += "\t" + (
                    " ".join(f"{f['kind']}/{f['rule']}@{f['text']}:{f['start']}-{f['end']}" for f in found) or "-"
                )
            out.write(line + "\n")
    out.flush()
    return code
