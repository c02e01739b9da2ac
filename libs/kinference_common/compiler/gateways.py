"""Gateway parents and the Inference Extension's own InferencePool.

Two questions the pool compilation asks, answered here from the input alone:

- **Which parents[] entries may Kinference write?** Only those of a parent
  Kinference serves: a Gateway that exists and whose GatewayClass's
  ``controllerName`` is :data:`ROUTER_CONTROLLER` (the router is that
  Gateway's implementation), or, for an Inference Extension pool Kinference
  picks endpoints for, any existing Gateway (entry under
  :data:`PICKER_CONTROLLER`). A Gateway that does not exist gets no entry
  (nothing accepted the pool there); the pool gets a warning saying why.
- **How does an Inference Extension pool (``inference.networking.k8s.io/v1``)
  become a Kinference pool?** :func:`as_kinference_pool`: its annotations
  give the policy and the destinations (docs/kubernetes.md); the compiled
  form is the same as a Kinference pool's.
"""

from __future__ import annotations

from dataclasses import dataclass

from kinference_common import API_GROUP
from kinference_common import resources as r

#: the controllerName of a GatewayClass whose Gateways Kinference's router implements
ROUTER_CONTROLLER = "kinference.buoyant.io/router"
#: the controllerName of the entries Kinference writes as a pool's endpoint picker
PICKER_CONTROLLER = "kinference.buoyant.io/endpoint-picker"
#: every controllerName whose parents[] entries this compiler owns (and removes)
OWN_CONTROLLERS = frozenset({ROUTER_CONTROLLER, PICKER_CONTROLLER})

GIE_POOL_KEY = f"InferencePool/{r.GIE_POOL_GROUP}"

_KINDS = {"InferenceWorkerSet", "InferenceProvider"}


@dataclass
class Translated:
    pool: r.InferencePool
    #: (path, message) problems with the annotations (the pool still compiles without them)
    problems: list[tuple[str, str]]


def parse_destinations(value: str) -> tuple[list[r.PoolDestination], list[str]]:
    """``"InferenceWorkerSet/a, InferenceProvider/b"`` -> destinations, and
    messages for entries that are not ``Kind/name``."""
    out: list[r.PoolDestination] = []
    bad: list[str] = []
    for raw in value.replace("\n", ",").split(","):
        item = raw.strip()
        if not item:
            continue
        kind, sep, name = item.partition("/")
        kind, name = kind.strip(), name.strip()
        if not sep or kind not in _KINDS or not name or "/" in name:
            bad.append(f"{item!r} is not InferenceWorkerSet/<name> or InferenceProvider/<name>")
            continue
        out.append(r.PoolDestination(kind=kind, name=name))  # type: ignore[arg-type]
    return out, bad


def as_kinference_pool(pool: r.GieInferencePool) -> Translated:
    """The Kinference pool an Inference Extension pool stands for: same
    namespace and name, ``policyRef`` from ``kinference.buoyant.io/policy``,
    ``destinations`` from ``kinference.buoyant.io/destinations`` (absent:
    every worker set of the namespace, no provider, as a Kinference pool)."""
    ann = pool.metadata.annotations
    problems: list[tuple[str, str]] = []
    policy = ann.get(r.POLICY_ANNOTATION, "").strip()
    destinations: list[r.PoolDestination] | None = None
    if r.DESTINATIONS_ANNOTATION in ann:
        destinations, bad = parse_destinations(ann[r.DESTINATIONS_ANNOTATION])
        for message in bad:
            problems.append((f"metadata.annotations[{r.DESTINATIONS_ANNOTATION}]", message + "; entry ignored"))
    spec = r.InferencePoolSpec(
        destinations=destinations or None,
        policy_ref=r.PolicyRef(name=policy) if policy else None,
    )
    kpool = r.InferencePool(api_version=f"{API_GROUP}/v1alpha1", kind="InferencePool",
                            metadata=pool.metadata, spec=spec)
    return Translated(kpool, problems)


def outside_pool(pool: r.GieInferencePool, ws: r.InferenceWorkerSet) -> str | None:
    """Why a gateway could not reach ``ws``'s pods through ``pool`` (None: it can).

    The gateway sends only to pods the pool's selector selects, on its
    targetPorts: every pod of the worker set is selected when its matchLabels
    include every label of the pool's selector."""
    want = pool.spec.selector.match_labels
    have = ws.spec.selector.match_labels
    missing = {k: v for k, v in want.items() if have.get(k) != v}
    ports = [p.number for p in pool.spec.target_ports]
    name = f"InferenceWorkerSet {ws.metadata.namespace}/{ws.metadata.name}"
    if missing:
        labels = ", ".join(f"{k}={v}" for k, v in sorted(missing.items()))
        return (f"{name} is left out: its selector does not require {labels}, so the pool's selector "
                "may not select its pods and a gateway could not reach them")
    if ws.spec.port not in ports:
        return (f"{name} is left out: its port {ws.spec.port} is not in the pool's targetPorts "
                f"{ports}, so a gateway could not reach it")
    return None
