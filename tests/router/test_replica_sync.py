"""Router replicas share their in-flight sends and prefix picks over a real
nats-server (services/router/replica_sync.py): a send on replica A moves
replica B's queue estimate and prefix matches within a few publishes; a
replica that stops publishing is forgotten after the TTL; garbled messages
are counted and dropped; no prompt text is ever published."""

from __future__ import annotations

import asyncio
from typing import Any

import nats
import pytest
from kinference_common import subjects
from kinference_common.engine import InFlightLedger, PrefixIndex, TTFTModel
from kinference_common.engine.signals import DecisionContext
from kinference_common.engine.tokens import block_hashes
from kinference_common.messages import ReplicaSync as SyncMessage, decoder
from kinference_router.metrics import RouterMetrics
from kinference_router.replica_sync import ReplicaSync, hash_key

from ..engine.helpers import ep, pool, snap, ws


def replica_of(data: bytes) -> str:
    return decoder(SyncMessage).decode(data).replica

SUBJECT = subjects.replica_sync_subject("default", "inference-all")
KEY0 = "default/qwen/q0"
KEY = hash_key("router-password")
PROMPT = ("You are the assistant of the Frobnicator Company; never reveal the launch code ZX-4471. " * 40
          + "What is the launch code?")


class Replica:
    def __init__(self, name: str, nc: Any, key: bytes = KEY, ttl: float = 2.0) -> None:
        self.ledger, self.prefix, self.metrics = InFlightLedger(), PrefixIndex(), RouterMetrics()
        self.sync = ReplicaSync(SUBJECT, self.ledger, self.prefix, self.metrics, hash_key=key, replica_id=name,
                                interval=0.02, heartbeat=0.2, ttl=ttl)
        self.nc = nc

    def count(self, direction: str, outcome: str) -> float:
        return self.metrics.registry.get_sample_value(
            "kinference_replica_sync_messages_total", {"direction": direction, "outcome": outcome}) or 0.0


async def _until(check, what: str, ticks: int = 300) -> None:  # noqa: ANN001
    """Poll (10 ms apart) until ``check()``; a bounded number of ticks, not a time limit on behaviour."""
    for _ in range(ticks):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"not reached: {what}")


async def _started(a: Replica, b: Replica) -> None:
    await a.sync.start(a.nc)
    await b.sync.start(b.nc)
    # each has heard the other's heartbeat: both subscriptions are live end to end
    await _until(lambda: a.ledger.peers and b.ledger.peers, "the replicas hear each other")


class Capture:
    """Every byte published on kinference.router.> (a third connection)."""

    def __init__(self) -> None:
        self.seen: list[bytes] = []

    async def on(self, msg) -> None:  # noqa: ANN001
        self.seen.append(msg.data)


@pytest.fixture
async def pair(nats_server_session):  # noqa: ANN001, ANN201
    ncs = [await nats.connect(nats_server_session.url) for _ in range(3)]
    capture = Capture()
    await ncs[2].subscribe(f"{subjects.ROUTER_PREFIX}.>", cb=capture.on)
    await ncs[2].flush()
    a, b = Replica("replica-a", ncs[0]), Replica("replica-b", ncs[1])
    await _started(a, b)
    await _until(lambda: {replica_of(d) for d in capture.seen} >= {"replica-a", "replica-b"},
                 "the capture hears both")
    yield a, b, ncs[2], capture
    for r in (a, b):
        await r.sync.stop()
    for nc in ncs:
        await nc.close()


async def test_a_send_on_one_replica_moves_the_others_queue_estimate_and_prefix_matches(pair) -> None:  # noqa: ANN001
    a, b, _, _ = pair
    s = snap(pool([ws("qwen", "qwen-2.5")]), [ep("qwen", "q0", queued=0, running=0)])
    c = s.candidates[0]
    ctx = lambda: DecisionContext(b.ledger.loads, 0, (), None, TTFTModel())  # noqa: E731
    assert ctx().queue_tokens(c) == 0
    hashes = block_hashes(PROMPT, key=KEY)
    send = a.ledger.sent(KEY0, 3000, 1e12)  # "after" any scrape B has seen: unseen, adds to the queue
    a.prefix.record(KEY0, hashes, 1000, kv_usage=0.2)
    await _until(lambda: ctx().queue_tokens(c) == 3000, "B counts A's pending 3,000 tokens")
    assert ctx().queued(c) == 1 and ctx().in_flight(c) == 1
    assert b.prefix.match(hashes) == {KEY0: len(hashes)}
    # with the KV usage A saw: B keeps of the pod's cache what A keeps
    assert b.prefix.fill(KEY0) == a.prefix.fill(KEY0) < PrefixIndex.KV_FILL
    assert b.sync.metrics.registry.get_sample_value("kinference_replica_sync_peers") == 1
    assert b.count("in", "merged") >= 1 and a.count("out", "sent") >= 1
    a.ledger.first_token(send, 1e12 + 1)
    a.ledger.finished(send, 1e12 + 2)
    await _until(lambda: ctx().queue_tokens(c) == 0 and ctx().in_flight(c) == 0, "B sees A's send finished")
    assert a.count("in", "own") >= 1  # each replica hears its own messages and ignores them


async def test_a_replica_that_stops_publishing_is_forgotten_after_the_ttl(pair) -> None:  # noqa: ANN001
    a, b, _, _ = pair
    a.ledger.sent(KEY0, 500, 1e12)
    await _until(lambda: KEY0 in b.ledger.loads and b.ledger.loads[KEY0].peer_pending_tokens == 500, "merged")
    assert b.ledger.peers == ["replica-a"]
    b.sync.ttl = 0.3  # a short TTL for the test; A goes quiet (stopped, as a crashed pod would)
    await a.sync.stop()
    await _until(lambda: b.ledger.peers == [], "A forgotten")
    assert KEY0 not in b.ledger.loads
    assert b.metrics.registry.get_sample_value("kinference_replica_sync_peers_expired_total") == 1
    assert b.metrics.registry.get_sample_value("kinference_replica_sync_peers") == 0


async def test_garbled_and_stale_messages_are_counted_and_dropped(pair) -> None:  # noqa: ANN001
    a, b, nc, capture = pair
    bad = [b"not json", b'{"replica": 3}', b'{"replica":"x","seq":1,"sentAt":1e12,"endpoints":[{"key":"k",'
           b'"inFlight":-4}]}', b"\xff\xfe", b'{"replica":"x","seq":1,"sentAt":1e12,"endpoints":'
           b'[{"key":"k","pending":[["a",1]]}]}']
    for data in bad:
        await nc.publish(SUBJECT, data)
    await nc.publish(SUBJECT, b'{"replica":"old-one","seq":1,"sentAt":5.0}')  # sent in 1970: stale
    await nc.flush()
    await _until(lambda: b.count("in", "garbled") == len(bad) and b.count("in", "stale") == 1, "all counted")
    assert b.ledger.peers in ([], ["replica-a"])  # nothing of the garbage merged
    assert "k" not in b.ledger.loads
    # and the router still merges good ones afterwards
    a.ledger.sent(KEY0, 77, 1e12)
    await _until(lambda: KEY0 in b.ledger.loads and b.ledger.loads[KEY0].peer_pending_tokens == 77, "merged")


async def test_no_prompt_text_in_any_published_byte(pair) -> None:  # noqa: ANN001
    a, b, nc, capture = pair
    seen = capture.seen
    hashes = block_hashes(PROMPT, key=KEY)
    a.ledger.sent(KEY0, 900, 1e12)
    a.prefix.record(KEY0, hashes, None)
    await _until(lambda: any(b'"blockHashes"' in d for d in seen), "a message with the prefix record")
    blob = b"".join(seen)
    for needle in ("Frobnicator", "launch code", "ZX-4471", PROMPT[:64]):
        assert needle.encode() not in blob, needle
    # the published hashes are the keyed ones: unkeyed (or differently keyed) hashes of the prompt are not there
    dec = decoder(SyncMessage)
    published = {h for d in seen for rec in dec.decode(d).prefix for h in rec.block_hashes}
    assert set(hashes) <= published
    assert not set(block_hashes(PROMPT)) & published
    assert not set(block_hashes(PROMPT, key=hash_key("another-password"))) & published


async def test_a_peer_with_another_hash_key_shares_loads_but_not_prefixes(nats_server_session) -> None:  # noqa: ANN001
    ncs = [await nats.connect(nats_server_session.url) for _ in range(2)]
    a, b = Replica("a", ncs[0], key=hash_key("one")), Replica("b", ncs[1], key=hash_key("two"))
    try:
        await _started(a, b)
        a.ledger.sent(KEY0, 10, 1e12)
        a.prefix.record(KEY0, block_hashes(PROMPT, key=hash_key("one")), None)
        await _until(lambda: b.count("in", "key_mismatch") >= 1, "mismatch counted")
        assert b.prefix.blocks(KEY0) == 0
        assert b.ledger.loads[KEY0].peer_pending_tokens == 10
    finally:
        for r in (a, b):
            await r.sync.stop()
        for nc in ncs:
            await nc.close()


# ------------------------------------------------- two real router replicas


async def test_two_router_replicas_share_a_send_through_the_http_path(start_pool) -> None:  # noqa: ANN001
    """A request in flight through router A's data port shows on router B's
    ledger (peers' in-flight and pending prompt tokens) and its prefix index;
    when it ends, B's view empties. With --no-replica-sync (C), nothing
    arrives."""
    import aiohttp
    from aiohttp import web
    from aiohttp.test_utils import TestServer

    from .manifests import one_worker_set_pool

    release = asyncio.Event()
    arrived = asyncio.Event()

    async def hang(request: web.Request) -> web.Response:
        await request.read()
        arrived.set()
        await release.wait()
        return web.json_response({"id": "x", "object": "chat.completion", "choices": [],
                                  "usage": {"prompt_tokens": 1, "completion_tokens": 1}})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", hang)
    upstream = TestServer(app)
    await upstream.start_server()
    manifests = one_worker_set_pool("shared")
    a = await start_pool(manifests, "shared")
    b = await start_pool(manifests, "shared")
    c = await start_pool(manifests, "shared", replica_sync=False)
    key = "default/stub/stub-0"
    try:
        for r in (a, b, c):
            await r.endpoint("stub", "m", f"127.0.0.1:{upstream.port}")
        await _until(lambda: a.router.ledger.peers and b.router.ledger.peers, "A and B hear each other")
        assert c.router.sync is None and c.router.ledger.peers == []
        body = {"model": "m", "messages": [{"role": "user", "content": PROMPT}]}
        async with aiohttp.ClientSession() as s:
            call = asyncio.create_task(s.post(a.url, json=body))
            await asyncio.wait_for(arrived.wait(), 10)
            await _until(lambda: key in b.router.ledger.loads and b.router.ledger.loads[key].peer_in_flight == 1,
                         "B sees A's request in flight")
            load = b.router.ledger.loads[key]
            assert load.peer_pending_count == 1 and load.peer_pending_tokens > 500  # the prompt's size, not 0
            hashes = block_hashes(PROMPT, key=b.router.settings.prefix_key)
            assert b.router.prefix.match(hashes).get(key) == len(hashes)
            assert key not in c.router.ledger.loads and c.router.prefix.blocks(key) == 0
            release.set()
            resp = await call
            assert resp.status == 200
            resp.release()
        await _until(lambda: key not in b.router.ledger.loads or b.router.ledger.loads[key].peer_in_flight == 0,
                     "B sees it finished")
        metrics = b.router.metrics.registry
        assert metrics.get_sample_value("kinference_replica_sync_peers") == 1
        assert metrics.get_sample_value("kinference_replica_sync_messages_total",
                                        {"direction": "in", "outcome": "merged"}) >= 1
    finally:
        release.set()
        await upstream.close()


def _peer_message(replica: str, seq: int = 1) -> bytes:
    from kinference_common.messages import ReplicaEndpoint, encode

    return encode(SyncMessage(replica=replica, seq=seq, sent_at=1e12,
                              endpoints=[ReplicaEndpoint(key=KEY0, in_flight=1, pending=[(1e12, 10)], prefilled=[])]))


def test_a_replica_alone_publishes_no_change_and_no_pick_until_a_peer_is_heard() -> None:
    """Alone (no peer heard), a send wakes nothing and a message (the
    heartbeat) carries the in-flight state but not the picks: one router
    pays no message per request. The first peer's message wakes the
    publisher, so the peer gets this replica's state within the interval;
    from then on every send is published with its picks (the picks made
    alone are never sent)."""
    a = Replica("replica-a", nc=None, ttl=1e15)  # a TTL past the test's clock: nothing expires
    a.sync.attach()  # what start() does, without NATS
    hashes = block_hashes(PROMPT, key=KEY)
    a.ledger.sent(KEY0, 300, 1e12)
    a.prefix.record(KEY0, hashes, None)
    assert not a.sync._wake.is_set()  # nobody listens: no message for this send
    alone = decoder(SyncMessage).decode(a.sync.build())
    assert [e.key for e in alone.endpoints] == [KEY0] and alone.prefix == []
    a.prefix.record(KEY0, block_hashes(PROMPT + " Another question?", key=KEY), None)  # still alone
    assert a.sync.receive(_peer_message("replica-b")) == "merged"
    assert a.sync._wake.is_set()  # the first peer: publish now, not at the next heartbeat
    a.sync._wake.clear()
    a.ledger.sent(KEY0, 400, 1e12)
    a.prefix.record(KEY0, hashes, None)
    assert a.sync._wake.is_set()  # with a peer, each send is published
    shared = decoder(SyncMessage).decode(a.sync.build())
    assert [list(r.block_hashes) for r in shared.prefix] == [list(hashes)]  # only the pick made with a peer
    a.sync._wake.clear()  # (publish() clears it)
    assert a.sync.receive(_peer_message("replica-b", seq=2)) == "merged"
    assert not a.sync._wake.is_set()  # a known peer's next message wakes nothing


def test_a_replica_drops_its_own_messages_by_their_sender_alone() -> None:
    """Each replica hears its own messages on the subject: told apart by the
    sender field without decoding the rest, so a replica never pays for
    decoding its own picks (the message below would not decode)."""
    a = Replica("replica-a", nc=None)
    broken = b'{"schemaVersion":1,"replica":"%s","seq":1,"sentAt":1e12,"endpoints":"not a list"}'
    assert a.sync.receive(broken % b"replica-a") == "own"
    assert a.sync.receive(broken % b"replica-b") == "garbled"
    assert a.sync.receive(b'{"seq":1}') == "garbled"  # no sender at all
    assert a.count("in", "own") == 1 and a.count("in", "garbled") == 2
