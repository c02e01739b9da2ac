"""mkdocs hook (mkdocs.yml `hooks:`): a page under docs/ that the nav does not
name is added to it, under the section its name belongs to (SECTIONS), else
under "More", titled by its first heading. So a new page written by any part
of the project is on the site without an edit to mkdocs.yml, and the strict
build still fails on a broken link."""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: page -> the nav section it goes in when the nav does not name it
SECTIONS = {
    "kubernetes.md": "Operations",
    "kubernetes-dataplane.md": "Operations",
    "failure-modes.md": "Operations",
    "hardening.md": "Operations",
    "nats-security.md": "Operations",
    "classification.md": "How it works",
    "routing-benchmark.md": "Benchmarks",
}


def _named(nav: Any) -> set[str]:
    out: set[str] = set()
    if isinstance(nav, str):
        out.add(nav)
    elif isinstance(nav, list):
        for n in nav:
            out |= _named(n)
    elif isinstance(nav, dict):
        for v in nav.values():
            out |= _named(v)
    return out


def _title(path: Path) -> str:
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    return path.stem.replace("-", " ").capitalize()


def add_missing(nav: list[Any], docs_dir: Path) -> list[Any]:
    """``nav`` with every page of ``docs_dir`` it does not name added."""
    named = _named(nav)
    missing = sorted(str(p.relative_to(docs_dir)) for p in docs_dir.rglob("*.md")
                     if str(p.relative_to(docs_dir)) not in named)
    for page in missing:
        entry = {_title(docs_dir / page): page}
        section = SECTIONS.get(page, "More")
        for item in nav:
            if isinstance(item, dict) and section in item and isinstance(item[section], list):
                item[section].append(entry)
                break
        else:
            nav.append({section: [entry]})
    return nav


def on_config(config: Any, **_: Any) -> Any:
    if config["nav"] is not None:
        config["nav"] = add_missing(config["nav"], Path(config["docs_dir"]))
    return config
