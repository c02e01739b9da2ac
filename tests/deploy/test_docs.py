"""The documentation site: the reference pages generated from the code build
with mkdocs in strict mode (a broken link, anchor or missing page fails);
every policy warning's documented example triggers it through the compiler
and its fix does not; every warning code, error code, trace field and page is
documented; the docs stand alone."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"

spec = importlib.util.spec_from_file_location("docgen", REPO / "tools" / "docgen.py")
docgen = importlib.util.module_from_spec(spec)
sys.modules["docgen"] = docgen
spec.loader.exec_module(docgen)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """docs/ and mkdocs.yml copied, the generated pages written, built strictly."""
    root = tmp_path_factory.mktemp("docs")
    shutil.copytree(DOCS, root / "docs")
    shutil.copy(REPO / "mkdocs.yml", root / "mkdocs.yml")
    (root / "tools").mkdir()
    shutil.copy(REPO / "tools" / "mkdocs_hooks.py", root / "tools" / "mkdocs_hooks.py")
    assert docgen.main(["--out", str(root / "docs" / "reference")]) == 0
    mkdocs = Path(sys.executable).with_name("mkdocs")
    out = subprocess.run([str(mkdocs), "build", "--strict", "-f", str(root / "mkdocs.yml"), "--site-dir",
                          str(root / "site")], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert out.returncode == 0, out.stderr
    return root


def nav_files() -> set[str]:
    nav = yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"]
    out: set[str] = set()

    def walk(node: object) -> None:
        if isinstance(node, str):
            out.add(node)
        elif isinstance(node, list):
            for n in node:
                walk(n)
        elif isinstance(node, dict):
            for v in node.values():
                walk(v)

    walk(nav)
    return out


def test_the_site_builds_strictly_with_every_page(site: Path) -> None:
    for page in nav_files():
        built = site / "site" / page.replace(".md", "") / "index.html"
        if page == "index.md":
            built = site / "site" / "index.html"
        assert built.exists(), page
    html = (site / "site" / "reference" / "crds" / "index.html").read_text()
    assert "spec.rules[].route.select[].minimize" in html


def test_the_committed_reference_pages_are_what_the_code_generates(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """The generated pages are committed (a reader browsing the repository
    follows docs/index.md's links to them): each must equal what the code
    generates now, whatever the environment the suite runs in (a help text
    that showed $NATS_URL's value as its default differed by machine)."""
    for name in docgen.PAGES:
        assert (REPO / "docs" / "reference" / name).exists(), f"docs/reference/{name} is not committed"
    with pytest.MonkeyPatch.context() as mp:
        for var, value in {"NATS_URL": "nats://elsewhere:4999", "HEALTH_PORT": "1",
                           "KINFERENCE_KV_REPLICAS": "3", "COLUMNS": "40"}.items():
            mp.setenv(var, value)
        rc = docgen.main(["--check"])
    assert rc == 0, capsys.readouterr().err + " (run .venv/bin/python tools/docgen.py and commit the pages)"
    # the check itself notices a page that differs
    changed = tmp_path / "reference"
    assert docgen.main(["--out", str(changed)]) == 0
    page = changed / next(iter(docgen.PAGES))
    page.write_text(page.read_text() + "\nedited by hand\n")
    assert docgen.main(["--check", "--out", str(changed)]) == 1


def test_a_broken_link_fails_the_build(site: Path, tmp_path: Path) -> None:
    shutil.copytree(site / "docs", tmp_path / "docs")
    shutil.copy(site / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(site / "tools", tmp_path / "tools")
    with (tmp_path / "docs" / "index.md").open("a") as f:
        f.write("\n[gone](no-such-page.md)\n")
    mkdocs = Path(sys.executable).with_name("mkdocs")
    out = subprocess.run([str(mkdocs), "build", "--strict", "-f", str(tmp_path / "mkdocs.yml"), "--site-dir",
                          str(tmp_path / "site")], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert out.returncode != 0 and "no-such-page.md" in out.stderr


def test_every_docs_page_is_on_the_site(site: Path) -> None:
    """The nav names the project's pages; a page it does not name (written by
    another part of the project) is added by the hook, in its section."""
    generated = {f"reference/{name}" for name in docgen.PAGES}
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")} | generated
    assert nav_files() - pages == set(), "the nav names pages that do not exist"
    for page in pages:
        built = site / "site" / ("index.html" if page == "index.md" else page.replace(".md", "/index.html"))
        assert built.exists(), page


def test_the_hook_puts_a_new_page_in_its_section(tmp_path: Path) -> None:
    spec_h = importlib.util.spec_from_file_location("mkdocs_hooks", REPO / "tools" / "mkdocs_hooks.py")
    hooks = importlib.util.module_from_spec(spec_h)
    spec_h.loader.exec_module(hooks)
    (tmp_path / "index.md").write_text("# Home\n")
    (tmp_path / "kubernetes.md").write_text("intro\n# Kinference on Kubernetes\n")
    (tmp_path / "odd.md").write_text("no heading\n")
    nav = hooks.add_missing([{"Home": "index.md"}, {"Operations": [{"Run": "index.md"}]}], tmp_path)
    assert nav == [{"Home": "index.md"},
                   {"Operations": [{"Run": "index.md"}, {"Kinference on Kubernetes": "kubernetes.md"}]},
                   {"More": [{"Odd": "odd.md"}]}]


_, EXAMPLES = docgen.warning_examples()


@pytest.mark.parametrize("entry", EXAMPLES, ids=[f"{e['code']}{'-doc' if e.get('document') else ''}" for e in EXAMPLES])
def test_each_documented_warning_example_triggers_it_and_its_fix_does_not(entry: dict) -> None:
    spec_, _ = docgen.warning_examples()
    example, fix = docgen.example_and_fix(entry, spec_)
    got = [f for f in docgen.compile_warnings(example) if f.code == entry["code"]]
    assert got, f"the example of {entry['code']} does not trigger it"
    # the page's "kinfctl lint says" line is a line `kinfctl lint` prints (the trial: it was not)
    import io

    from kinference_common.compiler import compile_documents
    from kinference_common.manifests import load_text
    from kinfctl.lint import print_text

    out = io.StringIO()
    print_text(compile_documents(load_text(example, "example.yaml")), out)
    assert f"{got[0].where}: {got[0].message}" in [line.strip() for line in out.getvalue().splitlines()]
    if entry.get("document") and not got[0].where.startswith("note "):
        # a document warning names its field (an Inference Extension pool's policy is in its annotations)
        assert any(w in got[0].where for w in (" spec", "spec.", " metadata.", " status."))
    assert entry["code"] not in {f.code for f in docgen.compile_warnings(fix)}, f"the fix still gives {entry['code']}"


def test_every_warning_code_of_the_compiler_is_documented() -> None:
    source = "".join(p.read_text() for p in (REPO / "libs" / "kinference_common" / "compiler").glob("*.py"))
    policy_codes = set(re.findall(r'\bwarn\(\s*"([A-Z]\w+)"', source))
    document_codes = set(re.findall(r'_doc_warning\(\s*\w+,\s*"([A-Z]\w+)"', source))
    assert len(policy_codes) >= 14 and len(document_codes) >= 4  # UnknownField is a document warning only: a policy's is an error
    documented_policy = {e["code"] for e in EXAMPLES if not e.get("document")}
    documented_docs = {e["code"] for e in EXAMPLES if e.get("document")}
    assert policy_codes - documented_policy == set()
    assert document_codes - documented_docs == set()


def test_every_decision_trace_field_is_described() -> None:
    fields = {path for path, _ in docgen.trace_fields()}
    assert fields - set(docgen.EXPLAIN_FIELDS) == set(), "describe them in tools/docgen.py EXPLAIN_FIELDS"
    assert set(docgen.EXPLAIN_FIELDS) - fields == set(), "EXPLAIN_FIELDS describes fields that are gone"


def test_every_described_field_exists() -> None:
    from kinference_common import crds

    paths = set()
    for entry in crds.KINDS:
        props = crds.crd(entry)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
        for root in ("spec", "status"):
            paths |= {f"{entry['kind']} {p}" for p in docgen.field_paths(props[root], root)}
    assert set(docgen.FIELD_MEANING) - paths == set()


def test_every_error_code_the_router_answers_is_documented() -> None:
    source = "".join(p.read_text() for p in (REPO / "services" / "router").glob("*.py"))
    codes = set(re.findall(r'ApiError\(\s*\d{3},\s*"([a-z_]+)"', source))
    codes |= set(re.findall(r'(?:on_error|_fail)\(\s*\d{3},\s*"([a-z_]+)"', source))
    codes |= set(re.findall(r'\.code = "([a-z_]+)"', source))
    engine = "".join(p.read_text() for p in (REPO / "libs" / "kinference_common" / "engine").glob("*.py"))
    codes |= set(re.findall(r'code = "([a-z_]+)"', engine))
    assert {"bad_request", "unauthorized", "no_capacity", "model_not_found", "policy_rejected"} <= codes
    page = (DOCS / "reference" / "http-api.md").read_text()
    assert {c for c in codes if f"`{c}`" not in page} == set()


FORBIDDEN = re.compile(r"\.\./shared|shared/(seeds|spec|notes)|\b(POLICY|RESOURCES|INTERFACES|ARCHITECTURE|TELEMETRY)\.md\b")


def test_the_docs_stand_alone(site: Path) -> None:
    texts = {str(p.relative_to(site)): p.read_text() for p in (site / "docs").rglob("*.md")}
    texts["README.md"] = (REPO / "README.md").read_text()
    bad = {name: FORBIDDEN.findall(text) for name, text in texts.items() if FORBIDDEN.search(text)}
    assert bad == {}


#: the users never saw the seed documents, and `make` takes no --port-offset flag
MISLEADING = re.compile(r"\bseed \d{3}\b|\bthe seeds\b|\bseeds'|make run --port-offset")


def test_the_docs_cite_no_seed_and_no_make_flag_that_does_not_exist(site: Path) -> None:
    """The trial found "seed 000" in `kinfctl get --help` (so in cli.md) and
    "as `make run --port-offset N`" in `kinfctl events --help`."""
    texts = {str(p.relative_to(site)): p.read_text() for p in (site / "docs").rglob("*.md")}
    texts["README.md"] = (REPO / "README.md").read_text()
    bad = {name: MISLEADING.findall(text) for name, text in texts.items() if MISLEADING.search(text)}
    assert bad == {}
    assert MISLEADING.search("blank (seed 000: x)") and MISLEADING.search("as `make run --port-offset N`")


def test_the_cli_reference_has_every_kinfctl_command(site: Path) -> None:
    """The trial found `audit` and `replay` missing from the page that says
    it has every flag of every command."""
    from kinfctl.main import build_parser

    page = (site / "docs" / "reference" / "cli.md").read_text()
    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    commands = set(sub.choices)
    assert {"audit", "replay", "lint"} <= commands
    assert {c for c in commands if f"## kinfctl {c}\n" not in page} == set()


def test_readme_is_short_and_points_to_the_site() -> None:
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) < 80
    assert "make docs" in readme and "docs/getting-started.md" in readme
    for link in re.findall(r"\]\(([^)#]+)", readme):
        if not link.startswith("http"):
            assert (REPO / link).exists(), link


def test_the_classify_example_shows_the_default_text_output() -> None:
    """The trial found the README's example showed JSON for the default output."""
    from kinfctl.main import main

    page = (DOCS / "reference" / "kinfctl.md").read_text()
    block = page[page.index("kinfctl classify\n"):]
    first = block.splitlines()[1]
    assert re.fullmatch(r"1\tpii-confirmed\t\d+us", first), first
    import io
    from contextlib import redirect_stdout

    buf = io.StringIO()
    sys_stdin = sys.stdin
    sys.stdin = io.StringIO('{"id": 1, "text": "call me at +1 415 555 0100"}\n')
    try:
        with redirect_stdout(buf):
            assert main(["classify"]) == 0
    finally:
        sys.stdin = sys_stdin
    assert re.fullmatch(r"1\tpii-confirmed\t\d+us\n", buf.getvalue()), buf.getvalue()


def test_no_command_renders_an_escaped_pipe() -> None:
    """Python-Markdown's tables keep ``\\|`` literally in a code span (a pipe in
    backticks does not split the cell): a copied command would break."""
    import markdown

    for page in sorted(DOCS.rglob("*.md")):
        html = markdown.markdown(page.read_text(), extensions=["tables"])
        for code in re.findall(r"<code>(.*?)</code>", html, flags=re.S):
            assert "\\|" not in code, f"{page.name}: {code}"


def test_make_help_speaks_to_users_in_aligned_columns() -> None:
    out = subprocess.run(["make", "-s", "help"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    lines = out.splitlines()
    assert lines and all("issue" not in line and "sims" not in line for line in lines), out
    # every description starts in the same column
    assert len({len(line) - len(line[len(line.split()[0]):].lstrip()) for line in lines}) == 1, out


def test_the_crd_pages_patterns_are_the_crds(site: Path) -> None:
    """The trial: every ``|`` of a pattern in crds.md's tables was written
    ``/`` (``(ns/us/µs/ms/s/m/h)``), a pattern that matches nothing the CRD
    takes. On the site, the duration fields show the CRD's own pattern."""
    import html as html_lib

    from kinference_common.crds import DURATION_PATTERN

    page = (site / "site" / "reference" / "crds" / "index.html").read_text()
    codes = [html_lib.unescape(c) for c in re.findall(r"<code>(.*?)</code>", page, flags=re.S)]
    shown = [c for c in codes if c.startswith("^(0")]
    assert shown and set(shown) == {DURATION_PATTERN}, set(shown)
