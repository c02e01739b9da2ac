"""Leader election on a ``coordination.k8s.io/v1`` Lease.

One replica holds the Lease (``holderIdentity``) and renews ``renewTime``
every ``retry_period``; the others read it every ``retry_period`` and take
it over once it has not been renewed for ``lease_duration`` (measured on
their own clock from when they last saw the record change, so clock skew
between nodes does not matter). Takeover and renewal are updates that carry
the Lease's ``resourceVersion``: two candidates racing for an expired Lease
cannot both win (the loser gets 409).

:attr:`LeaderElector.is_leader` is False from the moment a renewal fails,
and also once ``renew_deadline`` has passed since the last successful
renewal was sent (a renewal that hangs, or answers late), so a leader that cannot prove it still holds
the Lease stops writing before anyone else may start. ``on_started`` /
``on_stopped`` are called on every change of leadership. On a clean stop the
Lease is released (``holderIdentity`` cleared), so a standby takes over at
once rather than after the lease duration.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import structlog

from kinference_common.kube.client import ApiException, Obj, ResourceClient
from kinference_common.kube.kinds import LEASE
from kinference_common.tasks import cancel_and_wait

log = structlog.get_logger("kube.lease")


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ApiException):
        from kinference_common.kube.informer import api_message

        return f"{exc.status} {exc.reason}: {api_message(exc)}"
    return str(exc) or type(exc).__name__


def _micro() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    def __init__(
        self,
        rc: ResourceClient,
        namespace: str,
        name: str,
        identity: str,
        *,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        on_started: Callable[[], Any] = lambda: None,
        on_stopped: Callable[[], Any] = lambda: None,
    ) -> None:
        if not retry_period < renew_deadline < lease_duration:
            raise ValueError("need retry_period < renew_deadline < lease_duration")
        self.rc = rc
        self.namespace, self.name, self.identity = namespace, name, identity
        self.lease_duration, self.renew_deadline, self.retry_period = lease_duration, renew_deadline, retry_period
        self.on_started, self.on_stopped = on_started, on_stopped
        self._leading = False
        self._renewed_at = 0.0
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self.transitions_seen = 0
        self._last_error = ""
        self._last_error_at = 0.0

    @property
    def is_leader(self) -> bool:
        return self._leading and time.monotonic() - self._renewed_at < self.renew_deadline

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"lease-{self.name}")

    async def stop(self, release: bool = True) -> None:
        self._stopping = True  # wait_for in 3.11 may swallow the cancel below
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
        was = self._leading
        self._set_leading(False)
        if release and was:
            with contextlib.suppress(Exception):
                lease = await self.rc.get(LEASE, self.namespace, self.name)
                if (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                    lease["spec"]["holderIdentity"] = None
                    lease["spec"]["leaseDurationSeconds"] = 1
                    lease["spec"]["renewTime"] = _micro()
                    await self.rc.replace(LEASE, self.namespace, self.name, lease)
                    log.info("released lease", lease=f"{self.namespace}/{self.name}", identity=self.identity)

    def _standby_error(self, exc: BaseException) -> None:
        """A candidate that cannot read or take the Lease (403: no RBAC rule for
        leases; 404: its namespace does not exist) would otherwise stand by
        forever without a word: say why, when it changes and once a minute."""
        what, now = _describe(exc), time.monotonic()
        if what != self._last_error or now - self._last_error_at >= 60.0:
            self._last_error, self._last_error_at = what, now
            log.warning("cannot acquire the lease; standing by", lease=f"{self.namespace}/{self.name}",
                        identity=self.identity, error=what)

    def _set_leading(self, leading: bool) -> None:
        if leading == self._leading:
            return
        self._leading = leading
        log.info("leadership " + ("acquired" if leading else "lost"), lease=f"{self.namespace}/{self.name}",
                 identity=self.identity)
        (self.on_started if leading else self.on_stopped)()

    async def _run(self) -> None:
        while not self._stopping:
            # The server stamps renewTime while the request is in flight, and a
            # standby counts the lease duration from when it sees that stamp: the
            # renew deadline counts from when the attempt began, not from its answer.
            attempt_started = time.monotonic()
            try:
                ok = await asyncio.wait_for(self._try_acquire_or_renew(), timeout=self.renew_deadline)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the API server is away: we cannot prove we hold it
                if self._leading:
                    log.warning("lease renewal failed", error=_describe(exc))
                else:
                    self._standby_error(exc)
                ok = False
            if self._stopping:
                return
            if ok:
                self._renewed_at = attempt_started
                self._set_leading(True)
            else:
                self._set_leading(False)
            await asyncio.sleep(self.retry_period)

    async def _try_acquire_or_renew(self) -> bool:
        now = _micro()
        try:
            lease = await self.rc.get(LEASE, self.namespace, self.name)
        except ApiException as exc:
            if exc.status != 404:
                raise
            body: Obj = {
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": {"holderIdentity": self.identity, "leaseDurationSeconds": int(self.lease_duration),
                         "acquireTime": now, "renewTime": now, "leaseTransitions": 0},
            }
            try:
                await self.rc.create(LEASE, self.namespace, body)
            except ApiException as exc2:
                if exc2.status == 409:
                    return False
                raise
            return True
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        record = (holder, spec.get("renewTime"), spec.get("leaseDurationSeconds"))
        mono = time.monotonic()
        if record != self._observed:
            self._observed, self._observed_at = record, mono
        duration = float(spec.get("leaseDurationSeconds") or self.lease_duration)
        if holder and holder != self.identity and mono - self._observed_at < duration:
            return False  # someone else holds a live lease
        new_spec = dict(spec)
        new_spec["holderIdentity"] = self.identity
        new_spec["leaseDurationSeconds"] = int(self.lease_duration)
        new_spec["renewTime"] = now
        if holder != self.identity:
            new_spec["acquireTime"] = now
            new_spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (1 if holder else 0)
            self.transitions_seen += 1
        lease["spec"] = new_spec
        try:
            updated = await self.rc.replace(LEASE, self.namespace, self.name, lease)
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise
        s = updated.get("spec") or {}
        self._observed = (s.get("holderIdentity"), s.get("renewTime"), s.get("leaseDurationSeconds"))
        self._observed_at = time.monotonic()
        return True
