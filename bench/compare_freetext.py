"""The means compared for free-text PII: ``make compare-freetext``.

The libraries made for the job that install from the package index
(``usaddress``, ``pyap``, ``probablepeople``, ``names-dataset``; the
``compare`` extra) against the classifier's context rules, on the same texts
as the eval (:mod:`bench.eval_freetext`, report seed): recall of names and
addresses per split, the share of the hard clean set left alone, and CPU time
per call on 1 and 8 KB of hard clean prose. Each library is used the way it
can find something in prose:

- ``pyap``: ``parse(text, country=...)`` for US, GB and CA, found = any address;
- ``usaddress``: ``parse(text)``, found = an ``AddressNumber`` and a street
  type (``StreetNamePostType``/``StreetNamePreType``) among the labels;
- ``probablepeople``: ``parse(text)``, found = a ``GivenName`` and a ``Surname``;
- ``names-dataset``: two capitalised words in a row, the first among the
  5,000 most common first names of some country, the second a known last name;
- ``python-crfsuite``: a linear-chain CRF over word tokens (word shape, case,
  affixes, neighbours), trained here on texts of the dev split only (dev
  templates and locales, another seed) plus hard clean texts of another seed,
  as the rules were written looking at the dev split; found = a token tagged
  with the kind. Training time is its "load".

Prints a markdown table and writes ``bench/results/compare_freetext.json``.
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import time
from collections.abc import Callable
from pathlib import Path

from bench.eval_freetext import generate, hard_clean_prose

OUT = Path(__file__).resolve().parent / "results" / "compare_freetext.json"
_CAPS = re.compile(r"\b([A-Z][a-zà-ÿ]+)[ \t]+([A-Z][a-zà-ÿ'-]+)\b")


def _rules() -> Callable[[str], bool]:
    from kinference_common.detectors.core import Classifiers

    cl = Classifiers()
    cl.warm_up()
    return lambda t: cl.classify("pii", [t]).tags[0] != "pii-none"


def _pyap() -> Callable[[str], bool]:
    import pyap

    return lambda t: any(pyap.parse(t, country=c) for c in ("US", "GB", "CA"))


def _usaddress() -> Callable[[str], bool]:
    import usaddress

    def found(t: str) -> bool:
        labels = {label for _tok, label in usaddress.parse(t)}
        return "AddressNumber" in labels and bool(labels & {"StreetNamePostType", "StreetNamePreType"})

    return found


def _probablepeople() -> Callable[[str], bool]:
    import probablepeople

    def found(t: str) -> bool:
        labels = {label for _tok, label in probablepeople.parse(t)}
        return "GivenName" in labels and "Surname" in labels

    return found


def _names_dataset() -> Callable[[str], bool]:
    from names_dataset import NameDataset

    nd = NameDataset()

    def found(t: str) -> bool:
        for first, last in _CAPS.findall(t):
            f = nd.search(first).get("first_name") or {}
            ranks = [r for r in (f.get("rank") or {}).values() if r is not None]
            if ranks and min(ranks) <= 5000 and nd.search(last).get("last_name"):
                return True
        return False

    return found


_TOKEN = re.compile(r"\w+|[^\w\s]")
_RUNS = re.compile(r"(.)\1+")


def _features(tokens: list[str]) -> list[list[str]]:
    out = []
    for i, w in enumerate(tokens):
        shape = re.sub(r"[A-ZÀ-Þ]", "A", re.sub(r"[a-zß-ÿ]", "a", re.sub(r"[0-9]", "9", w)))
        short = _RUNS.sub(r"\1", shape)
        f = [f"w={w.lower()}", f"shape={short}", f"suf3={w[-3:].lower()}",
             f"pre2={w[:2].lower()}", f"cap={w[:1].isupper()}", f"digit={w.isdigit()}", f"len={min(len(w), 6)}"]
        for d in (-2, -1, 1, 2):
            j = i + d
            f.append(f"{d}:w={tokens[j].lower() if 0 <= j < len(tokens) else '^$'}")
            if 0 <= j < len(tokens):
                f.append(f"{d}:cap={tokens[j][:1].isupper()}")
        out.append(f)
    return out


def _labelled(text: str, spans: tuple[tuple[str, int, int], ...]) -> tuple[list[str], list[str]]:
    toks, labels = [], []
    for m in _TOKEN.finditer(text):
        toks.append(m.group(0))
        labels.append(next((k for k, s0, s1 in spans if s0 <= m.start() < s1), "O"))
    return toks, labels


def _crf() -> Callable[[str], bool]:
    import tempfile

    import pycrfsuite

    trainer = pycrfsuite.Trainer(verbose=False)
    for t in generate(400, 150, 20240501):  # another seed; the dev split and clean texts only
        if t.split == "held-out" or t.label not in ("person", "address") and not t.label.startswith("clean:"):
            continue
        toks, labels = _labelled(t.text, t.spans)
        trainer.append(_features(toks), labels)
    trainer.set_params({"c1": 0.1, "c2": 0.01, "max_iterations": 60})
    model = Path(tempfile.mkdtemp()) / "freetext.crfsuite"
    trainer.train(str(model))
    tagger = pycrfsuite.Tagger()
    tagger.open(str(model))

    def found(t: str) -> bool:
        toks = _TOKEN.findall(t)
        return any(label != "O" for label in tagger.tag(_features(toks))) if toks else False

    return found


MEANS: dict[str, tuple[Callable[[], Callable[[str], bool]], tuple[str, ...]]] = {
    "context rules (freetext.py)": (_rules, ("person", "address")),
    "pyap 0.3.1": (_pyap, ("address",)),
    "usaddress 0.5.16": (_usaddress, ("address",)),
    "probablepeople 0.5.6": (_probablepeople, ("person",)),
    "names-dataset 3.3.1": (_names_dataset, ("person",)),
    "python-crfsuite 0.9.12, trained here": (_crf, ("person", "address")),
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seed", type=int, default=31337, help="the eval's seed (default: the report seed)")
    p.add_argument("--per-kind", type=int, default=400, help="texts per entity kind, half per split")
    p.add_argument("--rounds", type=int, default=60, help="latency samples per size")
    p.add_argument("--out", type=Path, default=OUT, help="where to write the JSON rows")
    p.add_argument("--only", action="append", help="measure only the means whose name starts with this")
    args = p.parse_args(argv)
    texts = generate(args.per_kind, args.per_kind // 2, args.seed)
    clean = [t for t in texts if t.label.startswith("clean:")]
    sizes = {kb: hard_clean_prose(kb) for kb in (1, 8)}
    rows = []
    for name, (make, kinds) in MEANS.items():
        if args.only and not any(name.startswith(o) for o in args.only):
            continue
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t0 = time.perf_counter()
        found = make()
        load_s = time.perf_counter() - t0
        rss_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
        row: dict[str, object] = {"means": name, "load_s": round(load_s, 2), "rss_mb": round(rss_mb)}
        for kind in kinds:
            for split in ("dev", "held-out"):
                sel = [t for t in texts if t.label == kind and t.split == split]
                row[f"{kind}/{split}"] = round(sum(found(t.text) for t in sel) / len(sel), 3)
        row["clean_none"] = round(sum(not found(t.text) for t in clean) / len(clean), 3)
        for kb, prose in sizes.items():
            cpu = []
            for i in range(args.rounds):
                c0 = time.thread_time_ns()
                found(prose[i % len(prose)])
                cpu.append((time.thread_time_ns() - c0) / 1000)
            cpu.sort()
            row[f"cpu_{kb}kb_p50_us"] = round(cpu[len(cpu) // 2])
            row[f"cpu_{kb}kb_p99_us"] = round(cpu[min(len(cpu) - 1, int(0.99 * len(cpu)))])
        rows.append(row)
        print(json.dumps(row), flush=True)
    print("\n| means | person dev / held-out | address dev / held-out | hard clean none | CPU 1 KB p50/p99 (us) "
          "| CPU 8 KB p50/p99 (us) | load (s) / memory (MB) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        def pair(kind: str) -> str:
            return f"{r[f'{kind}/dev']:.3f} / {r[f'{kind}/held-out']:.3f}" if f"{kind}/dev" in r else "-"
        print(f"| {r['means']} | {pair('person')} | {pair('address')} | {r['clean_none']:.3f} | "
              f"{r['cpu_1kb_p50_us']} / {r['cpu_1kb_p99_us']} | {r['cpu_8kb_p50_us']} / {r['cpu_8kb_p99_us']} | "
              f"{r['load_s']} / {r['rss_mb']} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
