"""Leader election when the API server is slow (review of the Kubernetes
mode): a leader counts its renew deadline from when it *sent* the renewal,
not from when the answer came back. The server stamps ``renewTime`` while
the request is in flight; a standby measures the lease duration from when
it sees that stamp, so a leader that counted from the answer could still
write after a standby took over."""

from __future__ import annotations

import asyncio
import copy
import time

from kinference_common.kube.client import ApiException
from kinference_common.kube.lease import LeaderElector


class SlowLeases:
    """Lease get/create/replace in memory; ``replace`` answers ``delay`` seconds
    after it was applied (the reply is slow, the write was not)."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.obj: dict | None = None
        self.rv = 0
        self.replace_sent: list[float] = []
        self.answered: list[float] = []

    async def get(self, kind, ns, name):
        if self.obj is None:
            raise ApiException(status=404, reason="NotFound")
        return copy.deepcopy(self.obj)

    async def create(self, kind, ns, body):
        if self.obj is not None:
            raise ApiException(status=409, reason="AlreadyExists")
        self.rv += 1
        self.obj = copy.deepcopy(body)
        self.obj["metadata"]["resourceVersion"] = str(self.rv)
        return copy.deepcopy(self.obj)

    async def replace(self, kind, ns, name, body):
        self.replace_sent.append(time.monotonic())
        if body["metadata"].get("resourceVersion") != self.obj["metadata"]["resourceVersion"]:
            raise ApiException(status=409, reason="Conflict")
        self.rv += 1
        self.obj = copy.deepcopy(body)
        self.obj["metadata"]["resourceVersion"] = str(self.rv)
        applied = copy.deepcopy(self.obj)
        await asyncio.sleep(self.delay)
        self.answered.append(time.monotonic())
        return applied


async def test_renew_deadline_counts_from_when_the_renewal_was_sent():
    leases = SlowLeases(delay=0.6)
    el = LeaderElector(leases, "default", "l", "me", lease_duration=6.0, renew_deadline=4.0, retry_period=2.0)
    el.start()
    try:
        while not el.is_leader:  # the Lease is created (fast)
            await asyncio.sleep(0.01)
        while not leases.answered:  # the first renewal (slow), 2 s later
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)  # the elector notes its success
        sent = leases.replace_sent[0]
        assert len(leases.replace_sent) == 1
        # the server applied the renewal at `sent`; a standby may take over from
        # sent + lease_duration on, so the leader must stop by sent + renew_deadline
        assert el._renewed_at <= sent
        assert el.is_leader
    finally:
        await el.stop(release=False)


async def test_a_candidate_that_cannot_read_the_lease_says_why(kube_api, tmp_path):
    """RBAC without the leases rule (or a Lease namespace that does not exist)
    left a replica standing by forever without a word."""
    import structlog

    from kinference_common.kube.client import ResourceClient
    from kinference_common.kube.config import api_client

    kube_api.roles["no-leases"] = []
    kc = kube_api.write_kubeconfig(tmp_path / "kc", user="no-leases", token="t-no-leases")
    api = await api_client(kc, "kinference-policy-compiler")
    el = LeaderElector(ResourceClient(api), "kinference-system", "l", "me", lease_duration=3.0,
                       renew_deadline=2.0, retry_period=0.05)
    try:
        with structlog.testing.capture_logs() as logs:
            el.start()
            end = asyncio.get_running_loop().time() + 5
            while not [e for e in logs if e["event"].startswith("cannot acquire")]:
                assert asyncio.get_running_loop().time() < end, f"no word on why it stands by: {logs}"
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.3)  # several more failed attempts
        said = [e for e in logs if e["event"].startswith("cannot acquire")]
        assert len(said) == 1  # once, not once per attempt
        assert said[0]["lease"] == "kinference-system/l"
        assert said[0]["error"].startswith("403 Forbidden") and 'resource "leases"' in said[0]["error"]
        assert not el.is_leader
    finally:
        await el.stop()
        await api.close()
