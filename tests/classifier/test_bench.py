"""The evaluation and the benchmark run, and their data is what they say it is."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

pytest.importorskip("faker")

from bench import classifier as bench
from bench import eval_classifier as ev


def test_eval_runs_and_reports_every_entity(tmp_path: Path) -> None:
    out = tmp_path / "eval.md"
    assert ev.main(["--per-entity", "4", "--per-clean", "3", "--quick", "--out", str(out)]) == 0
    text = out.read_text()
    for entity in (*ev.STRUCTURED, *ev.NER):
        assert f"| {entity} |" in text
    assert "| **all clean** |" in text
    assert "same tag on every text" in text
    for kind in ("person", "address", "dob", "age"):
        assert f"| {kind} | held-out |" in text
    assert "| **all hard clean** |" in text


def test_free_text_eval_smoke() -> None:
    """A small run of the free-text eval: spans mark what the generator put there, the rules
    find most of it in both splits, and the hard clean texts stay clean (before and after)."""
    from bench import eval_freetext as ft
    from kinference_common.detectors.core import Classifiers
    from kinference_common.detectors.pii import SHAPED_RULES, PiiDetector

    texts = ft.generate(per_kind=40, per_clean=20, seed=4242)
    for t in texts:
        for kind, s0, s1 in t.spans:
            assert kind == t.label and t.text[s0:s1].strip() and s1 <= len(t.text)
    variants = {"before": Classifiers(detectors=(PiiDetector(rules=SHAPED_RULES),)), "after": Classifiers()}
    rows = ft.evaluate(texts, variants)
    for kind in ("person", "address", "dob"):
        for split in ("dev", "held-out"):
            after, before = rows["after"][f"{kind}/{split}"], rows["before"][f"{kind}/{split}"]
            assert after.n == 20 and after.tagged >= 16, (kind, split, after)
            assert before.tagged == 0
    clean = [r for key, r in rows["after"].items() if key.startswith("clean:")]
    assert sum(r.n - r.tagged for r in clean) >= 0.95 * sum(r.n for r in clean)


def test_generated_labels_hold() -> None:
    from stdnum import iban, luhn

    gen = ev.Generator(5)
    # national_id() keeps only draws python-stdnum accepts
    drawn = [gen._national_id() for _ in range(40)]
    assert any(not module.is_valid(value) for _, value, module in drawn)  # Faker's misses exist
    for _ in range(40):
        assert isinstance(gen.national_id(), str)
    # "failing checksums" never hold a Luhn-valid card-length number
    for _ in range(60):
        sample = gen.clean_bad_checksums()
        digits = "".join(c if c.isdigit() else " " for c in sample.replace(" ", ""))
        for run in digits.split():
            if len(run) == 16:
                assert not luhn.is_valid(run)
    assert iban.is_valid(gen.faker("de_DE").iban())


def test_render_counts_and_targets() -> None:
    samples = ev.generate(3, 2, 11)
    result = ev.evaluate(samples)
    rows = result["rows"]
    assert sum(r.n for r in rows.values()) == len(samples)  # type: ignore[attr-defined]
    md = ev.render(samples, result, argparse.Namespace(seed=11, per_entity=3, per_clean=2))
    assert md.startswith("# PII classifier evaluation")


def test_bench_prompts_have_the_sizes_and_content() -> None:
    data = bench.prompts()
    for (kb, content), texts in data.items():
        assert kb in bench.SIZES_KB and content in ("clean", "pii")
        for t in texts:
            assert abs(len(t) - kb * 1024) < 128
            assert ("jane.doe@example.org" in t) == (content == "pii")


def test_bench_in_process_rows(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(bench, "_iterations", lambda kb, quick: 20)
    out = tmp_path / "classifier.json"
    assert bench.main(["--no-nats", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert len(rows) == len(bench.SIZES_KB) * 3
    assert {r["content"] for r in rows} == {"clean", "pii", "hard clean"}
    for row in rows:
        assert set(row) == {"size_kb", "content", "path", "p50_us", "p99_us", "cpu_us", "cpu_p99_us"}
        assert row["path"] == "in-process" and row["p99_us"] >= row["p50_us"] > 0
        assert row["cpu_p99_us"] >= row["cpu_us"] > 0


def test_bench_against_a_revision_measures_both_in_the_same_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(bench, "_iterations", lambda kb, quick: 10)
    monkeypatch.setattr(bench, "SIZES_KB", (1,))
    out = tmp_path / "classifier.json"
    assert bench.main(["--no-nats", "--against", "HEAD", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert {r["path"] for r in rows} == {"in-process", "in-process@HEAD"}
    assert "x of HEAD" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="no-such-ref"):
        bench.main(["--no-nats", "--against", "no-such-ref", "--out", str(out)])
