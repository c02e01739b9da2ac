"""NATS subjects and JetStream KV buckets (ARCHITECTURE.md, NATS contract).

NATS subject tokens cannot contain ``.``, ``*``, ``>`` or white space, and KV
keys allow only ``[-/_=.a-zA-Z0-9]``; Kubernetes names never hold those
characters except ``.`` (allowed in some names), so :func:`token` escapes a
``.`` inside a name as ``_``. The mapping is documented here so tools that
subscribe by hand can build the same subjects.
"""

from __future__ import annotations

CONFIG_PREFIX = "kinference.config"
TELEMETRY_ENDPOINT_PREFIX = "kinference.telemetry.endpoint"
TELEMETRY_PROVIDER_PREFIX = "kinference.telemetry.provider"
OBSERVATIONS_PREFIX = "kinference.observations"
CLASSIFY_PREFIX = "kinference.classify"
DECISIONS_PREFIX = "kinference.decisions"
#: router replicas talking to each other (replica sync)
ROUTER_PREFIX = "kinference.router"

CONFIG_BUCKET = "kinference-config"
TELEMETRY_BUCKET = "kinference-telemetry"
#: the telemetry-collector replicas' heartbeats (membership for sharding)
COLLECTORS_BUCKET = "kinference-collectors"
#: GPU stats a DCGM exporter's owning collector replica shares with the others
COLLECTOR_GPU_SUBJECT = "kinference.collector.gpu"
#: each collector replica answers on ``<this>.<replica id>`` while it is connected:
#: NATS says "no responders" at once when it is not (a replica that died)
COLLECTOR_ALIVE_PREFIX = "kinference.collector.alive"

#: queue group shared by classifier replicas
CLASSIFIER_QUEUE_GROUP = "kinference-classifier"


def token(name: str) -> str:
    """A Kubernetes name as one subject token (``.`` -> ``_``)."""
    return name.replace(".", "_")


def config_subject(namespace: str, pool: str) -> str:
    return f"{CONFIG_PREFIX}.{token(namespace)}.{token(pool)}"


def config_key(namespace: str, pool: str) -> str:
    return f"{token(namespace)}.{token(pool)}"


#: keys of the config bucket under this prefix are not pools: the compiler's
#: record of each manifest file's last good version (a Kubernetes namespace
#: never starts with ``_``, so no pool key can look like one)
CONFIG_SOURCE_PREFIX = "_sources"


def config_source_key(digest: str) -> str:
    """The config bucket's key for the last good version of one manifest file
    (``digest``: hex digest of the file's name)."""
    return f"{CONFIG_SOURCE_PREFIX}.{digest}"


def is_pool_key(key: str) -> bool:
    """A key of the config bucket that holds a compiled pool (readers listing
    the bucket skip the others)."""
    return not key.startswith("_")


def endpoint_subject(namespace: str, worker_set: str, pod: str) -> str:
    return f"{TELEMETRY_ENDPOINT_PREFIX}.{token(namespace)}.{token(worker_set)}.{token(pod)}"


def endpoint_key(namespace: str, worker_set: str, pod: str) -> str:
    return f"endpoint.{token(namespace)}.{token(worker_set)}.{token(pod)}"


def provider_subject(namespace: str, provider: str) -> str:
    return f"{TELEMETRY_PROVIDER_PREFIX}.{token(namespace)}.{token(provider)}"


def provider_key(namespace: str, provider: str) -> str:
    return f"provider.{token(namespace)}.{token(provider)}"


def observations_subject(namespace: str, pool: str) -> str:
    return f"{OBSERVATIONS_PREFIX}.{token(namespace)}.{token(pool)}"


#: routers' reports of the providers' API keys they can read, beside the observations (a
#: namespace never starts with ``_``, so no observation subject looks like one)
PROVIDER_KEYS_PREFIX = f"{OBSERVATIONS_PREFIX}._keys"


def provider_keys_subject(router: str) -> str:
    return f"{PROVIDER_KEYS_PREFIX}.{token(router)}"


def classify_subject(classifier: str) -> str:
    return f"{CLASSIFY_PREFIX}.{classifier}"


def classify_batch_subject(classifier: str) -> str:
    """Batched classify requests (:class:`~kinference_common.messages.ClassifyBatch`)."""
    return f"{CLASSIFY_PREFIX}.{classifier}.batch"


def decisions_subject(namespace: str, pool: str) -> str:
    return f"{DECISIONS_PREFIX}.{token(namespace)}.{token(pool)}"


#: the replica-sync subject of routers serving several pools at once (four
#: tokens, so it never equals a pool's five-token subject)
ROUTER_SYNC_ALL = f"{ROUTER_PREFIX}.all.sync"


def replica_sync_subject(namespace: str, pool: str) -> str:
    """Router replicas of one pool share their in-flight sends and prefix
    picks here (:class:`~kinference_common.messages.ReplicaSync`)."""
    return f"{ROUTER_PREFIX}.{token(namespace)}.{token(pool)}.sync"
