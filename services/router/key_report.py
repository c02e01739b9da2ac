"""Which providers' API keys this router can read, reported for their status.

A provider whose Secret the router cannot read (its namespace is not among
``--secret-namespaces``, the Secret or its data key is missing, its value is
not base64) would otherwise show only as a 502 on the request that reaches
it. Every ``interval`` seconds the router checks the key of every provider of
the pools it serves (:func:`provider_keys`, pure but for the cache read) and
publishes the whole view (:class:`~kinference_common.messages.ProviderKeyReport`
on ``kinference.observations._keys.<replica>``); the telemetry-collector,
which writes InferenceProvider status, turns a problem into ``Ready=False``
with reason ``SecretNotWatched`` or ``SecretUnavailable``. Level-triggered: each
report replaces the replica's previous one, so a fixed Secret clears the
condition at the next report, and a replica that stops reporting is
forgotten after three periods.

The router logs a problem once when it appears (and once when it is gone),
naming the provider, the Secret and the fix; never a key's value.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from typing import Any

import structlog

from kinference_common import subjects
from kinference_common.compiled import CompiledPool
from kinference_common.messages import ProviderKey, ProviderKeyReport, encode
from kinference_common.tasks import cancel_and_wait
from kinference_router.upstream import SecretError, SecretNotWatched

log = structlog.get_logger("router.keys")

NOT_WATCHED = "SecretNotWatched"
UNAVAILABLE = "SecretUnavailable"


def provider_keys(pools: Iterable[CompiledPool], secrets: Any, *, unlisted: bool = True) -> list[ProviderKey]:
    """Every provider destination of ``pools`` once, with whether ``secrets``
    (``read(namespace, ref)``, and optionally ``listed(namespace)``) can give
    its key now. A watched namespace not listed yet (RBAC refuses it, or the
    list is under way) is a problem when ``unlisted``, else its providers are
    left out (the router just started). Sorted by namespace and name."""
    seen: dict[tuple[str, str], ProviderKey] = {}
    listed = getattr(secrets, "listed", lambda ns: True)
    for pool in pools:
        for dest in pool.destinations:
            if dest.provider is None or (dest.namespace, dest.name) in seen:
                continue
            ref = dest.provider.secret_ref
            problem, message = None, ""
            watched = getattr(secrets, "watches", lambda ns: True)(dest.namespace)
            if watched and not listed(dest.namespace):
                if not unlisted:
                    continue
                seen[(dest.namespace, dest.name)] = ProviderKey(
                    namespace=dest.namespace, name=dest.name, secret=f"{dest.namespace}/{ref.name}",
                    problem=UNAVAILABLE,
                    message=f"the router has not listed the Secrets of namespace {dest.namespace} (a 'forbidden' in "
                            f"its log: no RoleBinding of the ClusterRole kinference-router-secrets in "
                            f"{dest.namespace})")
                continue
            try:
                secrets.read(dest.namespace, ref)
            except SecretNotWatched as exc:
                problem, message = NOT_WATCHED, _fix_for(secrets, dest.namespace, str(exc))
            except SecretError as exc:
                problem, message = UNAVAILABLE, str(exc)
            except Exception as exc:  # a file that cannot be read: its type, never its contents
                problem, message = UNAVAILABLE, f"secret {dest.namespace}/{ref.name}: {type(exc).__name__}"
            seen[(dest.namespace, dest.name)] = ProviderKey(
                namespace=dest.namespace, name=dest.name, secret=f"{dest.namespace}/{ref.name}",
                problem=problem, message=message)
    return [seen[k] for k in sorted(seen)]


def _fix_for(secrets: Any, namespace: str, why: str) -> str:
    watched = getattr(secrets, "namespaces", None)
    return (f"{why}; it watches {', '.join(watched) if watched else 'no namespace'}: add {namespace} to the "
            f"router's --secret-namespaces and bind the ClusterRole kinference-router-secrets to its "
            f"ServiceAccount in {namespace} with a RoleBinding")


class KeyReporter:
    """Publishes :func:`provider_keys` of ``pools()`` every ``interval`` seconds
    (the first at once); ``nc`` None only logs."""

    def __init__(self, nc: Any, pools: Callable[[], Iterable[CompiledPool]], secrets: Any, replica: str, *,
                 interval: float = 10.0, grace: float = 30.0, clock: Callable[[], float] = time.time) -> None:
        self.nc, self.pools, self.secrets, self.replica = nc, pools, secrets, replica
        self.interval, self.clock = interval, clock
        #: seconds after start during which a namespace not listed yet is not a problem
        self.grace = grace
        self._started_at = clock()
        self.subject = subjects.provider_keys_subject(replica)
        self.reports = 0
        #: (namespace, name) -> the problem last logged
        self._logged: dict[tuple[str, str], str] = {}
        self._task: asyncio.Task[None] | None = None

    def check(self) -> list[ProviderKey]:
        keys = provider_keys(self.pools(), self.secrets, unlisted=self.clock() - self._started_at >= self.grace)
        now = {(k.namespace, k.name): k for k in keys if k.problem}
        for key, k in now.items():
            if self._logged.get(key) != k.message:
                log.warning("provider API key unreadable", provider=f"{k.namespace}/{k.name}", reason=k.problem,
                            message=k.message)
        for key in set(self._logged) - set(now):
            log.info("provider API key readable again", provider=f"{key[0]}/{key[1]}")
        self._logged = {key: k.message for key, k in now.items()}
        return keys

    async def report_once(self) -> None:
        keys = self.check()
        if self.nc is None:
            return
        msg = ProviderKeyReport(router=self.replica, sent_at=self.clock(), interval=self.interval, providers=keys)
        try:
            await self.nc.publish(self.subject, encode(msg))
            self.reports += 1
        except Exception as exc:  # NATS away: the next period sends the whole view again
            log.debug("provider key report not sent", error=type(exc).__name__)

    async def _run(self) -> None:
        while True:
            try:
                await self.report_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a bug here must not stop the reports for good
                log.warning("provider key check failed", error=f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(self.interval)

    def start(self) -> None:
        self._started_at = self.clock()
        self._task = asyncio.create_task(self._run(), name="provider-key-report")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
