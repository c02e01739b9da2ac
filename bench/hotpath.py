"""The router's per-request CPU cost outside HTTP (``python -m bench.hotpath``).

Times, in-process with ``time.perf_counter`` over ``--iterations`` calls
after a warm-up, the four steps the router runs per request on a typical
chat completion (a system and a user message) against 3 local endpoints and
1 provider under the seed burst policy (:func:`bench.decision.build_world`):

- ``parse``: :func:`kinference_common.request_body.parse` of the raw body;
- ``engine request``: :func:`kinference_router.app.engine_request` (rewrite,
  token estimate, block hashes, headers), with the block-hash key a router
  with replica sync (the default) uses; its ``block hashes`` share is shown
  on the row under it, not added to the total, and under that the same
  hashes without the message-prefix memo
  (:func:`kinference_common.engine.block_hashes` of the joined texts);
- ``decide``: :func:`kinference_common.engine.decide`;
- ``trace``: ``encode_trace(build_trace(d, ..., scores=False))``, the
  decision event;
- ``record``: the decision record (:mod:`kinference_router.recording`):
  ``Recorder.capture`` when deciding, then building and encoding the
  record (queued on a publisher that sends nothing); :func:`recording_cost`
  gives the same to ``make bench-router``.

A bare function call is timed the same way, so the figures can be read as
ratios on whatever machine runs them. ``--system-chars 16384`` gives the
system message that many characters (a long shared prompt: 64 blocks to
hash) instead of the default one-line one.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import random
import time

import msgspec

from bench.decision import build_world
from kinference_common.engine import block_hashes, decide, prompt_block_hashes
from kinference_common.engine.trace import ClassifierTrace, build_trace, encode_trace
from kinference_router.app import engine_request
from kinference_common.request_body import parse
from kinference_router.replica_sync import DEFAULT_INTERVAL as REPLICA_SYNC_INTERVAL, hash_key


SYSTEM = "You are a helpful assistant. Answer briefly and cite sources."


def system_prompt(chars: int) -> str:
    """A system message of ``chars`` characters of plain English (``SYSTEM`` when 0)."""
    if chars <= 0:
        return SYSTEM
    words = "you are a careful assistant for the support team answer with the policy text".split()
    rng = random.Random(chars)
    text = ""
    while len(text) < chars:
        text += " ".join(rng.choice(words) for _ in range(64)) + ".\n"
    return text[:chars]


def body(k: int, system: str = SYSTEM) -> bytes:
    """A chat body; ``k`` makes the user message unique (no two requests share it)."""
    return msgspec.json.encode({
        "model": "qwen-2.5",
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": f"Question {k}: what is the capital of France, and why is it famous? "
                                        "Please answer in two short paragraphs."},
        ],
        "stream": True,
        "max_tokens": 256,
        "temperature": 0.2,
    })


#: as the router's HTTP server hands them over: names lower-cased
HEADERS = {k.lower(): v for k, v in {
    "Host": "router.default.svc:8080",
    "User-Agent": "OpenAI/Python 1.51.0",
    "Accept": "application/json",
    "Accept-Encoding": "gzip, deflate",
    "Content-Type": "application/json",
    "Content-Length": "312",
    "Authorization": "Bearer sk-team-alice",
    "Connection": "keep-alive",
    "X-Stainless-Lang": "python",
}.items()}


def per_call_us(fn, iterations: int, rounds: int) -> float:
    for _ in range(min(1000, iterations)):
        fn()
    gc.collect()
    best = float("inf")
    for _ in range(rounds):  # the best round: the least disturbed by the machine
        start = time.perf_counter()
        for _ in range(iterations):
            fn()
        best = min(best, (time.perf_counter() - start) / iterations * 1e6)
    return best


class _NoPublisher:
    def publish(self, subject: str, data: bytes) -> None:
        self.last = data


def recording_cost(iterations: int = 5_000, rounds: int = 9) -> dict[str, float]:
    """The decision record's CPU per request, in-process: capture (on the
    request path), build + encode + queue (after it), the record's size;
    and one snapshot record's build + encode (once per snapshot a decision
    used, at most every 50 ms)."""
    from kinference_router.recording import Recorder, RecordSettings

    rng = random.Random(7)
    snap, ledger, prefix, _ = build_world(3, 1, rng)
    snap.inputs = ({}, {})
    reqs = [msgspec.structs.replace(engine_request(snap, HEADERS, parse(body(k), chat=True), "alice", rng),
                                    tags=frozenset({"pii-none"})) for k in range(1024)]
    decisions = [decide(snap, r, ledger=ledger, prefix=prefix, rng=rng) for r in reqs]
    pub = _NoPublisher()
    rec = Recorder(pub, snap.namespace, snap.name, RecordSettings())
    traces = [ClassifierTrace(name="pii", ms=1.234, outcome="ok")]
    outcome = build_trace(decisions[0], scores=False).outcome
    d_it = itertools.cycle(decisions)
    capture = per_call_us(lambda: rec.capture(next(d_it)), iterations, rounds)
    for d in decisions:
        rec.capture(d)
    record = per_call_us(lambda: rec.decision(next(d_it), "0" * 32, traces, outcome), iterations, rounds)
    size = len(pub.last)
    # the baseline of the same run: the decision event every router already builds
    event = per_call_us(lambda: encode_trace(build_trace(next(d_it), decision_id="0" * 32, classifiers=traces,
                                                         scores=False)), iterations, rounds)

    def snapshot_record() -> None:
        rec._last = None
        rec._snapshot(snap)

    snapshot = per_call_us(snapshot_record, max(100, iterations // 10), rounds)
    return {"capture_us": round(capture, 2), "record_us": round(record, 2), "decision_record_bytes": size,
            "decision_event_us": round(event, 2),
            "snapshot_record_us": round(snapshot, 2), "snapshot_record_bytes": len(pub.last)}


def replica_sync_cost(iterations: int = 2_000, rounds: int = 9, endpoints: int = 8, pending: int = 4,
                      picks: int = 0, blocks: int = 64) -> dict[str, float]:
    """One replica sync message's CPU, in-process: building and encoding it
    (:meth:`ReplicaSync.build`) and merging a peer's (:meth:`ReplicaSync.receive`),
    for a pool of ``endpoints`` pods with ``pending`` sends before their first
    token on each and ``picks`` prefix picks of ``blocks`` blocks since the
    previous message. The picks cost the same however they are batched (each
    is sent once); the rest is paid per message, so it is what a shorter
    interval adds."""
    from kinference_common.engine import InFlightLedger, PrefixIndex
    from kinference_router.metrics import RouterMetrics
    from kinference_router.replica_sync import ReplicaSync

    key = hash_key(None)
    keys = [f"default/qwen/q{i}" for i in range(endpoints)]
    rng = random.Random(11)

    def replica(name: str) -> ReplicaSync:
        return ReplicaSync("kinference.router.default.bench.sync", InFlightLedger(), PrefixIndex(), RouterMetrics(),
                           hash_key=key, replica_id=name, clock=lambda: 1_000.0)

    a, b = replica("a"), replica("b")
    a.receive(msgspec.json.encode({"replica": "b", "seq": 1, "sentAt": 1_000.0}))  # a peer heard: a publishes its picks
    for k in keys:
        for j in range(pending):
            a.ledger.sent(k, 2_000 + j, 999.99)
    a.prefix.start_journal()
    h_it = itertools.cycle([tuple(rng.getrandbits(63) for _ in range(blocks)) for _ in range(64)])

    def build() -> bytes:
        for j in range(picks):
            a.prefix.record(keys[j % endpoints], next(h_it), 20_000, 0.5)
        return a.build()

    build_us = per_call_us(build, iterations, rounds)
    # a newer message from the same peer each time (else it is dropped as "old")
    messages = [build() for _ in range(iterations * rounds + min(1000, iterations))]
    m_it = iter(messages)
    outcomes: set[str] = set()
    receive_us = per_call_us(lambda: outcomes.add(b.receive(next(m_it))), iterations, rounds)
    assert outcomes == {"merged"}, outcomes
    own = messages[-1]
    own_us = per_call_us(lambda: outcomes.add(a.receive(own)), iterations, rounds)  # its own, heard back
    assert outcomes == {"merged", "own"}, outcomes
    return {"build_us": round(build_us, 2), "receive_us": round(receive_us, 2), "own_us": round(own_us, 2),
            "message_bytes": len(messages[0])}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=5_000, help="calls per round")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--system-chars", type=int, default=0,
                        help="characters of the system message (default: one line; 16384 for a long prompt)")
    args = parser.parse_args(argv)

    key = hash_key(None)  # as a router with replica sync derives it (no NATS password here)
    rng = random.Random(7)
    snap, ledger, prefix, _ = build_world(3, 1, rng)
    system = system_prompt(args.system_chars)
    # distinct bodies, more than any memo holds: each request's user message is new
    raws = [body(k, system) for k in range(4096)]
    parsed = [parse(r, chat=True) for r in raws]
    reqs = [msgspec.structs.replace(engine_request(snap, HEADERS, b, "alice", rng, key),
                                    tags=frozenset({"pii-none"})) for b in parsed]
    decisions = [decide(snap, r, ledger=ledger, prefix=prefix, rng=rng) for r in reqs]
    assert all(d.routed for d in decisions)
    traces = [ClassifierTrace(name="pii", ms=1.234, outcome="ok")]
    decision_id = "0" * 32
    raw_it, parsed_it, req_it, d_it = (itertools.cycle(x) for x in (raws, parsed, reqs, decisions))

    steps = {
        "parse": lambda: parse(next(raw_it), chat=True),
        "engine request": lambda: engine_request(snap, HEADERS, next(parsed_it), "alice", rng, key),
        "  block hashes": lambda: prompt_block_hashes(next(parsed_it).texts, key=key),
        "  (unmemoised)": lambda: block_hashes("\n".join(next(parsed_it).texts), key=key),
        "decide": lambda: decide(snap, next(req_it), ledger=ledger, prefix=prefix, rng=rng),
        "trace": lambda: encode_trace(build_trace(next(d_it), decision_id=decision_id, classifiers=traces,
                                                  scores=False)),
    }
    base = per_call_us(lambda: next(raw_it), args.iterations, args.rounds)
    blocks = len(reqs[0].block_hashes)
    print(f"system message {len(system)} characters, {blocks} blocks hashed per request")
    print(f"{'step':<16}{'us/call':>10}{'x call':>10}")
    total = 0.0
    for name, fn in steps.items():
        us = per_call_us(fn, args.iterations, args.rounds)
        if not name.startswith("  "):  # a part of the row above, not a step of its own
            total += us
        print(f"{name:<16}{us:>10.2f}{us / base:>10.0f}")
    cost = recording_cost(args.iterations, args.rounds)
    record = cost["capture_us"] + cost["record_us"]
    total += record
    print(f"{'record':<16}{record:>10.2f}{record / base:>10.0f}")
    print(f"{'total':<16}{total:>10.2f}{total / base:>10.0f}")
    print(f"{'(bare call)':<16}{base:>10.3f}")
    n = max(500, args.iterations // 5)
    sync, picks = replica_sync_cost(n, args.rounds), replica_sync_cost(n, args.rounds, picks=2)
    per_pick = [(picks[k] - sync[k]) / 2 for k in ("build_us", "receive_us")]
    # what the interval sets: one message out and one in from each of two peers per interval
    per_second = (sync["build_us"] + 2 * sync["receive_us"]) / REPLICA_SYNC_INTERVAL / 1000
    print(f"replica sync, off the request path: a message for 8 pods with 4 sends waiting on each "
          f"({sync['message_bytes']} bytes) takes {sync['build_us']:.1f} us to build and {sync['receive_us']:.1f} us "
          f"to merge; each prefix pick of 64 blocks in it adds {per_pick[0]:.1f} / {per_pick[1]:.1f} us. "
          f"At one message per {REPLICA_SYNC_INTERVAL * 1000:g} ms out and one in from each of two peers, "
          f"the per-message part is {per_second:.1f} ms of CPU a second; its own message, heard back, "
          f"{picks['own_us']:.1f} us to drop. Alone (no peer heard) a replica sends only a heartbeat every 0.5 s")


if __name__ == "__main__":
    main()
