"""Code shared by Kinference's services and ``kinfctl``.

Modules, one concern each:

- :mod:`~kinference_common.resources`: the Kubernetes resources as msgspec Structs.
- :mod:`~kinference_common.manifests`: reading YAML/JSON manifests into those
  Structs, with errors that name the document and the field path.
- :mod:`~kinference_common.compiled`: the executable form of a pool and its policy
  (what the policy-compiler publishes and the router decides on).
- :mod:`~kinference_common.messages`: every NATS message type.
- :mod:`~kinference_common.subjects`: NATS subjects and KV bucket names.
- :mod:`~kinference_common.classifiers`: the built-in classifiers' metadata.
- :mod:`~kinference_common.durations`: ``"800ms"``-style durations.
- :mod:`~kinference_common.compiler`: pool resolution, policy compilation, status.
- :mod:`~kinference_common.engine`: the decision engine (pure, no I/O).
"""

API_GROUP = "kinference.buoyant.io"
API_VERSION = "v1alpha1"
GROUP_VERSION = f"{API_GROUP}/{API_VERSION}"
