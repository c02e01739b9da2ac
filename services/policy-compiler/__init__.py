"""The policy-compiler service: reads Kinference manifests (a directory in
local mode; the Kubernetes API comes later behind the same
:class:`~kinference_policy_compiler.source.ManifestSource` interface),
compiles them with :mod:`kinference_common.compiler`, publishes one compiled
pool per InferencePool on NATS, and writes every object's status where the
operator can read it."""
