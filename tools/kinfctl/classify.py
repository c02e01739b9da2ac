"""``kinfctl classify``: run a built-in classifier on prompts read from stdin.

Each stdin line is a JSON object: ``{"id": ..., "text": "..."}``, or an
OpenAI-style body (``{"id": ..., "messages": [...]}`` or ``"prompt"``) read
exactly as the router would. One line is written per input line:
``{"id", "tags", "micros"}`` with ``-o json`` (plus ``outcome`` and
``findings``), or ``ID  TAG  MICROS`` as text. The classification is the
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
    p.set_defaults(run=run)


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
        if args.output == "json":
            record = {
                "id": ident,
                "tags": reply.tags,
                "micros": reply.micros,
                "outcome": reply.outcome,
                "findings": reply.findings,
            }
            out.write(_encode.encode(record).decode() + "\n")
        else:
            out.write(f"{ident}\t{','.join(reply.tags)}\t{reply.micros:.0f}us\n")
    out.flush()
    return code
