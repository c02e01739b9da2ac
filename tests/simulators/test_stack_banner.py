"""``make run``'s banner names the directory the policy-compiler watches: a
copy of deploy/examples in the run directory (the provider's address moved by
the port offset), not deploy/examples itself, so an edit there is not seen
by a running stack (the trial edited deploy/examples and nothing changed)."""

from __future__ import annotations

from pathlib import Path

from kinference_simulators.stack import EXAMPLES, Stack, banner


def test_the_banner_prints_the_manifests_directory_the_compiler_watches(tmp_path: Path) -> None:
    stack = Stack(tmp_path / ".run-100", 100)
    stack.prepare()
    compiler = next(p for p in stack.plan("fast", 1.0) if p.name == "policy-compiler")
    watched = Path(compiler.argv[compiler.argv.index("--manifests") + 1])
    assert watched == stack.run_dir / "manifests" and watched != EXAMPLES
    text = banner(stack)
    line = next(x for x in text.splitlines() if x.strip().startswith("Manifests (watched)"))
    assert line.split()[-1] == f"{watched}/"
    assert "deploy/examples" in text  # where the copy comes from (an edit there needs a restart)
    # the copy is what the compiler reads: the provider's address moved by the offset
    assert {f.name for f in watched.glob("*.yaml")} == {f.name for f in EXAMPLES.glob("*.yaml")}
    copied = "".join(f.read_text() for f in watched.glob("*.yaml"))
    assert "127.0.0.1:8400" in copied and "127.0.0.1:8300" not in copied
