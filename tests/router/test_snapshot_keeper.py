"""The keeper builds each snapshot from the previous one (``Snapshot.updated``),
and whole when that is not possible or fails."""

from __future__ import annotations

import msgspec
import pytest
import structlog
from kinference_common.engine import InFlightLedger, Snapshot
from kinference_router.state import SnapshotKeeper

from tests.engine.helpers import NOW, ep, pool, ws


def keeper_with(n: int) -> SnapshotKeeper:
    k = SnapshotKeeper("default", "pool", InFlightLedger(), clock=lambda: NOW)
    for i in range(n):
        k.set_endpoint(ep("ws-a", f"p{i}"))
    k.set_pool(pool([ws("ws-a", "m1")], []))
    return k


def test_a_rebuild_shares_what_did_not_change_and_a_new_pool_builds_whole() -> None:
    k = keeper_with(20)
    first = k.snapshot
    assert first is not None
    k.set_endpoint(msgspec.structs.replace(k.endpoints["default/ws-a/p3"], queued=7))
    k.rebuild()
    second = k.snapshot
    assert second is not None and second.version == first.version + 1
    assert [c.id for a, c in zip(first.candidates, second.candidates, strict=True) if a is not c] == \
        ["Local/ws-a/p3"]
    assert second.by_id["Local/ws-a/p3"].queued == 7
    assert k.pool is not None
    k.set_pool(msgspec.structs.replace(k.pool, revision="r2"))
    third = k.snapshot
    assert third is not None and third.revision == "r2"
    assert all(a is not c for a, c in zip(second.candidates, third.candidates, strict=True))


def test_an_incremental_rebuild_that_fails_is_logged_and_built_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    k = keeper_with(5)

    def broken(self: Snapshot, *a: object, **kw: object) -> Snapshot:
        raise RuntimeError("a bug in updated")

    monkeypatch.setattr(Snapshot, "updated", broken)
    k.set_endpoint(msgspec.structs.replace(k.endpoints["default/ws-a/p1"], queued=3))
    with structlog.testing.capture_logs() as logs:
        k.rebuild()
    assert k.snapshot is not None and k.snapshot.by_id["Local/ws-a/p1"].queued == 3
    (line,) = [e for e in logs if e["log_level"] == "error"]
    assert line["event"].startswith("incremental snapshot rebuild failed") and "a bug in updated" in line["error"]
