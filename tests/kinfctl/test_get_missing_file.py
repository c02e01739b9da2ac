"""``kinfctl get -f`` on input that cannot be read prints the error only, and
exits 1 as lint and explain do (the trial got ``No resources found.`` and the
error: the first line said the input was read and held nothing)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kinfctl.main import main

REPO = Path(__file__).resolve().parents[2]


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("output", ["table", "json"])
def test_a_missing_file_is_the_error_alone(tmp_path: Path, output: str, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nonexist"
    code, out, err = run(["get", "pools", "-f", str(missing), "-o", output], capsys)
    assert code == 1
    assert out == ""
    assert err.strip().splitlines() == [f"kinfctl: error: {missing}: no such file or directory"]


def test_a_file_that_does_not_parse_is_the_error_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: [\n")
    code, out, err = run(["get", "pools", "-f", str(bad)], capsys)
    assert code == 1 and out == "" and err.startswith(f"kinfctl: error: {bad}")


def test_a_readable_file_without_the_kind_still_says_no_resources(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["get", "providers", "-f", str(REPO / "deploy/examples/10-burst-policy.yaml")], capsys)
    assert (code, out, err) == (0, "No resources found.\n", "")


def test_an_error_beside_good_input_keeps_the_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["get", "pools", "-f", str(REPO / "deploy/examples"), "-f", str(tmp_path / "nope"),
                          "-o", "json"], capsys)
    assert code == 1 and "no such file or directory" in err
    assert [p["metadata"]["name"] for p in json.loads(out)] == ["inference-all"]
