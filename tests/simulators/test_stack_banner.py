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


def test_the_banner_warns_when_the_manifests_it_started_with_have_errors(tmp_path: Path) -> None:
    """User trial: with a typo in the example policy, `make run` printed
    "Kinference is running." and nothing else; the pool ran on the default
    policy (bursting silently off) and the error sat in errors.yaml. The
    banner now says so, with the first errors, from what the compiler wrote."""
    from kinference_common.compiler import compile_documents
    from kinference_policy_compiler.source import DirectorySource
    from kinference_policy_compiler.statuses import StatusDirectory

    stack = Stack(tmp_path / ".run-100", 100)
    stack.prepare()

    def compile_pass() -> None:
        source = DirectorySource(stack.run_dir / "manifests")
        source.poll()
        res = compile_documents(source.documents())
        StatusDirectory(stack.run_dir / "status").write(res, [*source.errors(), *res.errors], source.documents())

    compile_pass()
    assert "WARNING" not in banner(stack)
    policy = stack.run_dir / "manifests" / "10-burst-policy.yaml"
    policy.write_text(policy.read_text().replace("queuedPrompts:", "queuedPrompt:", 1))
    compile_pass()
    text = banner(stack)
    assert "WARNING: the manifests have 1 error; what they break is not in force:" in text
    assert "10-burst-policy.yaml#1 (InferencePolicy default/burst-unless-pii) at " \
           "spec.rules[0].route.exclude[0].drop.queuedPrompt (line 14):" in text
    assert f"kinfctl lint {stack.run_dir / 'manifests'}" in text
    assert text.index("WARNING") < text.index("Press Ctrl-C")


def test_each_port_of_a_stack_is_named_once() -> None:
    """HA trial: a refused `make run-ha` listed port 4522 twice (the cluster's
    first NATS server is the single server's port)."""
    for options in ({}, {"nats_cluster": True}, {"envoy": True}, {"envoy": True, "nats_cluster": True}):
        ports = Stack(Path("/nonexistent/.run-300"), 300, **options)._ports()  # type: ignore[arg-type]
        assert len(ports) == len(set(ports)), options
