"""The router's event publisher (services/router/events.py)."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry, Counter

from kinference_router.events import EventPublisher

import pytest


class FakeNats:
    is_connected = True
    is_closed = False
    stats = {"reconnects": 0}

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []

    async def publish(self, subject: str, data: bytes) -> None:
        self.sent.append((subject, data))

    async def flush(self, timeout: float | None = None) -> None:
        pass


async def test_stop_neither_loses_nor_hides_queued_messages() -> None:
    """stop() comes usually during the task's 2 ms linger: what is queued then
    (at shutdown, the last requests' observations) is published or counted in
    kinference_events_dropped_total, never lost silently (a review found it
    was)."""
    nc = FakeNats()
    dropped = Counter("dropped", "d", registry=CollectorRegistry())
    pub = EventPublisher(nc, dropped)  # type: ignore[arg-type]
    pub.start()
    await asyncio.sleep(0)
    for i in range(3):
        pub.publish("s", str(i).encode())
    await pub.stop()
    assert len(nc.sent) + dropped._value.get() == 3, (nc.sent, dropped._value.get())


@pytest.mark.nats
async def test_events_published_while_the_server_dies_reach_a_subscriber_elsewhere(nats_cluster) -> None:  # type: ignore[no-untyped-def]
    """kill -9 of the NATS server the router is connected to: what it
    publishes meanwhile (and the batch the server died under) arrives
    through another server of the cluster; nothing is dropped or lost."""
    import nats as nats_py

    from kinference_common import bus

    # every server, as --nats-url lists them, the first one first: the one to be killed
    router = await bus.connect(nats_cluster.url, name="router", dont_randomize=True)
    assert router.connected_url.port == nats_cluster.servers[0].port
    watcher = await nats_py.connect(nats_cluster.urls[1])
    got: list[bytes] = []

    async def on(msg) -> None:  # type: ignore[no-untyped-def]
        if msg.data != b"-1" or not got:  # the probes: one is enough
            got.append(msg.data)

    await watcher.subscribe("kinference.decisions.>", cb=on)
    await bus.sync(watcher)
    for _ in range(100):  # the subscription's interest has reached the router's server over the route
        await router.publish("kinference.decisions.probe", b"-1")
        await asyncio.sleep(0.05)
        if got:
            break
    got.clear()
    dropped = Counter("dropped", "d", registry=CollectorRegistry())
    pub = EventPublisher(router, dropped, linger=0)
    pub.start()
    try:
        for i in range(20):
            pub.publish("kinference.decisions.default.p", f"{i}".encode())
        await asyncio.sleep(0.2)
        nats_cluster.kill(0)
        for i in range(20, 60):
            pub.publish("kinference.decisions.default.p", f"{i}".encode())
            await asyncio.sleep(0.01)
        for _ in range(100):
            if len(got) == 60:
                break
            await asyncio.sleep(0.1)
        assert set(int(g) for g in got) == set(range(60)) and dropped._value.get() == 0
        assert len(got) - 60 <= pub.resent  # a duplicate only of a batch sent again
    finally:
        await pub.stop()
        await bus.close(router)
        await watcher.close()


@pytest.mark.nats
async def test_records_sent_while_their_streams_leader_dies_are_stored(nats_cluster) -> None:  # type: ignore[no-untyped-def]
    """The records' stream (three replicas) stores only what arrives while it
    has a leader: killing the leader lost every record of the seconds the
    two left took to elect another (a trial of make run-ha: all of 4.5 s of
    traffic). The publisher sends them again until the stream answers."""
    from kinference_common import bus
    from kinference_router.recording import RecordSettings, ensure_stream

    router = await bus.connect(nats_cluster.url, name="router")
    try:
        assert await ensure_stream(router, RecordSettings(replicas=3), attempts=5, wait=0.2)
        js = router.jetstream()
        dropped = Counter("dropped", "d", registry=CollectorRegistry())
        pub = EventPublisher(router, dropped, stored=("kinference.record.", "KINFERENCE_RECORDS"))
        pub.start()
        leader = (await js.stream_info("KINFERENCE_RECORDS")).cluster.leader
        victim = int(leader.rsplit("-", 1)[1])
        sent = 0
        for i in range(400):  # 40 records a second for 10 s, with decision events between them
            if i == 40:
                nats_cluster.kill(victim)
            pub.publish(f"kinference.record.d.{i % 3}", f"record {i}".encode())
            pub.publish("kinference.decisions.x", b"event")
            sent += 1
            await asyncio.sleep(0.025)
        stored = 0
        deadline = asyncio.get_running_loop().time() + 60  # an election under load takes seconds, not minutes
        while asyncio.get_running_loop().time() < deadline:
            try:
                stored = (await router.jetstream(timeout=1).stream_info("KINFERENCE_RECORDS")).state.messages
            except Exception:
                pass
            if not pub._unconfirmed and not pub._pending and stored >= sent:
                break
            await asyncio.sleep(0.1)
        await pub.stop()
        assert pub.resent_stored > 0  # the election really lost some, and they went again
        assert dropped._value.get() == 0
        # every record is stored (those stored just before the leader died, twice); read
        # once the killed server is back (a consumer needs JetStream's meta leader, which
        # may have died with the stream's)
        nats_cluster.restart(victim)
        await asyncio.to_thread(nats_cluster.wait_healthy, 30)
        got: set[bytes] = set()
        sub = await js.subscribe("kinference.record.>", stream="KINFERENCE_RECORDS", ordered_consumer=True)
        for _ in range(stored):
            got.add((await sub.next_msg(timeout=5)).data)
        await sub.unsubscribe()
        assert got == {f"record {i}".encode() for i in range(sent)}, (len(got), sent, stored)
    finally:
        await bus.close(router)


@pytest.mark.nats
@pytest.mark.parametrize("survivor", ["follower", "leader"])
async def test_records_sent_while_the_cluster_has_no_quorum_are_stored_once_it_is_back(nats_cluster, survivor) -> None:  # type: ignore[no-untyped-def]
    """HA trial: with two of three servers down, the one left answered the
    stream's info with no leader, the publisher took that as "stored", said
    the stream was available again, and ~700 records were lost. Now records
    are held until the stream has a leader again and then sent once more,
    once (not at every check of the outage: a follower of the subject saw
    each decision up to 23 times). The server left may be the stream's
    leader, which names itself for a while without its quorum and stores
    nothing: the stream's sequence tells."""
    from kinference_common import bus
    from kinference_router.recording import RecordSettings, ensure_stream

    setup = await bus.connect(nats_cluster.url, name="setup")
    try:
        assert await ensure_stream(setup, RecordSettings(replicas=3), attempts=5, wait=0.2)
        leader = (await setup.jetstream().stream_info("KINFERENCE_RECORDS")).cluster.leader
    finally:
        await bus.close(setup)
    led = int(leader.rsplit("-", 1)[1])
    stays = led if survivor == "leader" else (led + 1) % 3
    router = await bus.connect(nats_cluster.urls[stays], name="router")
    watcher = await bus.connect(nats_cluster.urls[stays], name="watcher")
    seen: list[bytes] = []
    try:
        js = router.jetstream()
        async def on(msg):  # type: ignore[no-untyped-def]
            seen.append(msg.data)

        await watcher.subscribe("kinference.record.>", cb=on)
        await bus.sync(watcher)
        dropped = Counter("dropped", "d", registry=CollectorRegistry())
        pub = EventPublisher(router, dropped, stored=("kinference.record.", "KINFERENCE_RECORDS"))
        pub.start()
        for i in range(10):
            pub.publish(f"kinference.record.d.{i % 3}", f"record {i}".encode())
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.3)
        down = [k for k in range(3) if k != stays]
        for k in down:
            nats_cluster.kill(k)
        await asyncio.sleep(1.0)  # the stream has lost its quorum
        for i in range(10, 70):  # three seconds of records with no leader anywhere
            pub.publish(f"kinference.record.d.{i % 3}", f"record {i}".encode())
            await asyncio.sleep(0.05)
        assert pub._stream_away and pub._unconfirmed  # held, not taken for stored
        for k in down:
            nats_cluster.restart(k)
        await asyncio.to_thread(nats_cluster.wait_healthy, 60)
        deadline = asyncio.get_running_loop().time() + 60
        stored = 0
        while asyncio.get_running_loop().time() < deadline:
            try:
                stored = (await router.jetstream(timeout=1).stream_info("KINFERENCE_RECORDS")).state.messages
            except Exception:
                pass
            if not pub._unconfirmed and not pub._pending and not pub._stream_away and stored >= 70:
                break
            await asyncio.sleep(0.1)
        await pub.stop()
        assert dropped._value.get() == 0
        got: set[bytes] = set()
        sub = await js.subscribe("kinference.record.>", stream="KINFERENCE_RECORDS", ordered_consumer=True)
        for _ in range(stored):
            got.add((await sub.next_msg(timeout=5)).data)
        await sub.unsubscribe()
        assert got == {f"record {i}".encode() for i in range(70)}, (len(got), stored)
        counts = {m: seen.count(m) for m in set(seen)}
        assert max(counts.values()) <= 2, sorted(counts.items(), key=lambda kv: -kv[1])[:3]
    finally:
        await bus.close(router)
        await watcher.close()



@pytest.mark.nats
async def test_records_are_confirmed_again_after_their_stream_is_made_again(nats_server) -> None:  # type: ignore[no-untyped-def]
    """Review: a stream deleted and made again starts its sequence over, the
    publisher waited for it to pass the old one, never confirmed a record
    again, and at its capacity dropped every new one (storing() False for
    good) while the stream stored them."""
    from kinference_common import bus
    from kinference_router.recording import RecordSettings, ensure_stream

    router = await bus.connect(nats_server.url, name="router")
    try:
        assert await ensure_stream(router, RecordSettings(), attempts=5, wait=0.2)
        js = router.jetstream()
        dropped = Counter("dropped", "d", registry=CollectorRegistry())
        pub = EventPublisher(router, dropped, capacity=200, stored=("kinference.record.", "KINFERENCE_RECORDS"))
        pub.start()
        for i in range(100):
            pub.publish("kinference.record.d.x", f"first {i}".encode())
            await asyncio.sleep(0.002)
        await asyncio.sleep(0.5)
        await js.delete_stream("KINFERENCE_RECORDS")
        assert await ensure_stream(router, RecordSettings(), attempts=5, wait=0.2)
        for i in range(300):
            pub.publish("kinference.record.d.x", f"second {i}".encode())
            await asyncio.sleep(0.005)
        for _ in range(100):
            if not pub._unconfirmed and not pub._pending and pub.storing():
                break
            await asyncio.sleep(0.1)
        await pub.stop()
        assert pub.storing() and not pub._unconfirmed and dropped._value.get() == 0
        got = set()
        sub = await js.subscribe("kinference.record.>", stream="KINFERENCE_RECORDS", ordered_consumer=True)
        for _ in range((await js.stream_info("KINFERENCE_RECORDS")).state.messages):
            got.add((await sub.next_msg(timeout=5)).data)
        await sub.unsubscribe()
        assert {f"second {i}".encode() for i in range(300)} <= got
    finally:
        await bus.close(router)


class _ScriptedStream:
    """A records stream whose answers a test sets: its leader, or an error to raise."""

    def __init__(self) -> None:
        self.leader: str | None = "nats-0"
        self.error: Exception | None = None

    def jetstream(self, timeout: float = 1.0):  # type: ignore[no-untyped-def]
        stream = self

        class JS:
            async def stream_info(self, name):  # type: ignore[no-untyped-def]
                if stream.error is not None:
                    raise stream.error
                return type("I", (), {"cluster": type("C", (), {"leader": stream.leader})(),
                                      "state": type("S", (), {"last_seq": 0})()})()
        return JS()


async def test_records_sent_again_at_the_end_of_a_drain_do_not_stop_the_publisher() -> None:
    """Review: records put back on the queue by the check at the end of a
    drain (a new leader, or the end of an outage) left the publisher waiting
    for a wake-up that never came (publish() wakes it only when the queue
    goes from empty to one): every later record and event piled up and was
    dropped."""
    nc = FakeNats()
    script = _ScriptedStream()
    nc.jetstream = script.jetstream  # type: ignore[attr-defined]
    dropped = Counter("dropped", "d", registry=CollectorRegistry())
    pub = EventPublisher(nc, dropped, linger=0, stored=("kinference.record.", "KINFERENCE_RECORDS"))  # type: ignore[arg-type]
    pub.start()
    try:
        pub.publish("kinference.record.x", b"r0")
        await asyncio.sleep(0.2)  # confirmed under nats-0
        script.leader = None  # an outage: held
        pub.publish("kinference.record.x", b"r1")
        await asyncio.sleep(0.4)
        assert pub._stream_away and pub._unconfirmed
        script.leader = "nats-1"  # back, another leader: r1 goes again, once
        for i in range(30):
            pub.publish("kinference.decisions.x", f"e{i}".encode())
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.5)
        sent = [d for _, d in nc.sent]
        assert all(f"e{i}".encode() in sent for i in range(30)), sent[-5:]
        assert sent.count(b"r1") == 2 and not pub._pending and dropped._value.get() == 0
    finally:
        await pub.stop()


async def test_nats_without_jetstream_keeps_no_records_and_holds_none() -> None:
    """Review: with recording on and NATS without JetStream (the router
    routes on, unrecorded, and says so), records were held for a stream that
    cannot exist until the queue filled, and then decision events were
    dropped too."""
    from nats.js.errors import ServiceUnavailableError

    nc = FakeNats()
    script = _ScriptedStream()
    script.error = ServiceUnavailableError()  # what nats-py raises when no JetStream answers
    nc.jetstream = script.jetstream  # type: ignore[attr-defined]
    dropped = Counter("dropped", "d", registry=CollectorRegistry())
    pub = EventPublisher(nc, dropped, linger=0, capacity=50,  # type: ignore[arg-type]
                         stored=("kinference.record.", "KINFERENCE_RECORDS"))
    pub.start()
    try:
        for i in range(120):
            pub.publish("kinference.record.x", f"r{i}".encode())
            pub.publish("kinference.decisions.x", f"e{i}".encode())
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.3)
        assert dropped._value.get() == 0 and not pub._unconfirmed and pub.storing()
    finally:
        await pub.stop()
