"""Every flag of every command says what it does in ``--help``. The trial
found ``--nats-url``, ``--host``, ``--max-body-bytes``, ``--log-level`` and
``-o`` printed with no word about them."""

from __future__ import annotations

import argparse
import contextlib
import importlib
from collections.abc import Callable
from typing import Any

import pytest

from kinfctl.main import build_parser as kinfctl_parser

SERVICES = ["kinference_router.__main__", "kinference_policy_compiler.__main__",
            "kinference_collector.__main__", "kinference_classifier.__main__"]


def parser_of(main: Callable[[list[str]], Any], monkeypatch: pytest.MonkeyPatch) -> argparse.ArgumentParser:
    """The parser ``main`` builds, caught when it parses (nothing runs)."""
    caught: list[argparse.ArgumentParser] = []

    def catch(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        caught.append(self)
        raise SystemExit(0)

    with monkeypatch.context() as m:
        m.setattr(argparse.ArgumentParser, "parse_args", catch)
        with contextlib.suppress(SystemExit):
            main([])
    assert caught, "main did not parse its arguments"
    return caught[0]


def undocumented(parser: argparse.ArgumentParser) -> list[str]:
    return [a.option_strings[-1] for a in parser._actions
            if a.option_strings and not a.help and not isinstance(a, argparse._HelpAction)]


@pytest.mark.parametrize("module", SERVICES)
def test_every_service_flag_has_help(module: str, monkeypatch: pytest.MonkeyPatch) -> None:
    parser = parser_of(importlib.import_module(module).main, monkeypatch)
    assert undocumented(parser) == []


def test_every_kinfctl_flag_has_help() -> None:
    sub = next(a for a in kinfctl_parser()._actions if isinstance(a, argparse._SubParsersAction))
    missing = {name: undocumented(p) for name, p in sub.choices.items() if undocumented(p)}
    assert missing == {}


def test_a_flag_without_help_is_caught() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--quiet-one")
    assert undocumented(p) == ["--quiet-one"]
