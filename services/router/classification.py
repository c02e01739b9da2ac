"""The router's classification: lazy, on the configured path, with back-pressure.

One :class:`Classification` per router; one :class:`RequestTags` per request
(:meth:`Classification.start`). The request path calls
:meth:`RequestTags.decide` instead of deciding directly:

- **Lazy** (:mod:`kinference_common.engine.lazy`): the classifiers a request
  requires are asked only when their answer can change the decision; what
  was skipped, and why, goes into the trace (``classifiers[].outcome:
  skipped``). A request about to wait in flow control's queue, whose later
  decisions are synchronous, is classified first (:meth:`RequestTags.complete`).
- **Path**, per classifier, from the compiled policy (the compiler's
  ``--in-process-classifier``): the classifier service over NATS (default),
  or the pattern detectors inside this process (no prompt on the bus).
- **Back-pressure** (:class:`Pressure`), per classifier on the service path:
  at most ``limit`` classify requests in flight; the limit shrinks when
  answers miss their deadline and grows back while they arrive in time
  (additive increase, multiplicative decrease). A request over the limit
  is not sent: it gets the classifier's failure tag at once (``outcome:
  shed``), so it stays local exactly as if the classifier had failed,
  while the requests within the limit are answered in time and clean ones
  still burst. Sending them all would put every one of them behind the
  same backlog and make them all late (the cliff this replaces).
  Sustained deadline misses (over :attr:`Pressure.threshold` of the answers
  in the last :attr:`Pressure.window` seconds) set
  ``kinference_classifier_overloaded{classifier}`` and log one line with the
  rate when they start, every ``log_every`` seconds while they last, and
  when they end: never one line per request.

Tags of a request are the failure tag of any classifier that failed, was
shed or is absent: the router never fails open.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import structlog
from prometheus_client import Counter, Gauge

import nats.errors

from kinference_common.classifiers import BUILTIN_CLASSIFIERS, DEFAULT_MAX_CHARS, IN_PROCESS, SERVICE
from kinference_common.classify_client import SERVICE_SHARE, classify_body, failure
from kinference_common.messages import ClassifyBatch, ClassifyBatchReply, ClassifyReply, ClassifyRequest, decoder, encode
from kinference_common.subjects import classify_batch_subject
from kinference_common.engine import Decision, InFlightLedger, PrefixIndex, Request, Snapshot
from kinference_common.engine.lazy import decide_lazily
from kinference_common.engine.trace import ClassifierTrace
from kinference_common.prompt_texts import texts_from_body

log = structlog.get_logger("router.classification")


class Pressure:
    """One classifier's service path: the in-flight limit and the miss rate."""

    def __init__(self, name: str, *, max_limit: int = 256, min_limit: int = 4, window: float = 10.0,
                 threshold: float = 0.1, min_answers: int = 20, log_every: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self.deadline = BUILTIN_CLASSIFIERS[name].deadline_seconds
        self.max_limit, self.min_limit = max_limit, min_limit
        self.limit = float(max_limit)
        self.in_flight = 0
        self.window, self.threshold, self.min_answers, self.log_every = window, threshold, min_answers, log_every
        self.clock = clock
        #: (second, answers, misses, shed) per second of the window
        self._buckets: deque[list[float]] = deque()
        self._last_decrease = -1e9
        self.overloaded = False
        self._last_log = -1e9

    def admit(self) -> bool:
        if self.in_flight >= int(self.limit):
            self._count(shed=True)
            return False
        self.in_flight += 1
        return True

    def answered(self, missed: bool) -> None:
        self.in_flight -= 1
        now = self.clock()
        if missed:
            # once per deadline: the answers in flight together miss together
            if now - self._last_decrease > self.deadline:
                self.limit = max(float(self.min_limit), self.limit * 0.75)
                self._last_decrease = now
        else:
            self.limit = min(float(self.max_limit), self.limit + 1.0 / max(self.limit, 1.0))
        self._count(missed=missed, answered=True)

    def _count(self, *, missed: bool = False, answered: bool = False, shed: bool = False) -> None:
        now = self.clock()
        sec = int(now)
        b = self._buckets
        if not b or b[-1][0] != sec:
            b.append([sec, 0, 0, 0])
            while b and b[0][0] <= sec - self.window:
                b.popleft()
        last = b[-1]
        last[1] += answered
        last[2] += missed
        last[3] += shed

    def rate(self) -> tuple[int, int, int]:
        """``(answers, misses, shed)`` over the window."""
        now = int(self.clock())
        a = m = s = 0
        for sec, answers, misses, shed in self._buckets:
            if sec > now - self.window:
                a, m, s = a + answers, m + misses, s + shed
        return int(a), int(m), int(s)

    def check(self) -> tuple[bool, str | None]:
        """``(overloaded, log line or None)``: cheap, called after each answer."""
        answers, misses, shed = self.rate()
        now = self.clock()
        over = answers >= self.min_answers and misses > self.threshold * answers
        over = over or (shed > 0 and misses > 0)
        line = None
        if over and (not self.overloaded or now - self._last_log >= self.log_every):
            line = "start" if not self.overloaded else "continue"
        elif not over and self.overloaded:
            line = "end"
        self.overloaded = over
        if line is not None:
            self._last_log = now
        return over, line


#: loop turns a reply may take, after the deadline, to be parsed once it reached the socket
GRACE_TURNS = 3


class Batcher:
    """Classify requests on the wire in batches: every request for a
    classifier made in one turn of the event loop goes out as one
    :class:`ClassifyBatch` (at most ``max_items`` items, ``max_bytes`` of
    text), answered by one reply. Under a burst the router's loop and the
    classifier each handle one message instead of hundreds. The deadline
    runs from when the batch is sent: time a request spent before that in
    this router's own queue (at most one loop turn) is not the classifier's."""

    def __init__(self, nc: Callable[[], Any], *, max_items: int = 32, max_bytes: int = 512 * 1024,
                 max_chars: int = DEFAULT_MAX_CHARS) -> None:
        self._nc = nc
        self.max_items, self.max_bytes, self.max_chars = max_items, max_bytes, max_chars
        self._pending: dict[str, list[tuple[ClassifyRequest, asyncio.Future[ClassifyReply], float]]] = {}
        self._bytes: dict[str, int] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._decoder = decoder(ClassifyBatchReply)

    async def classify(self, name: str, body: dict[str, Any], request_id: str) -> ClassifyReply:
        started = time.perf_counter()
        ex = texts_from_body(body)
        size = sum(len(t) for t in ex.texts)
        if size > self.max_chars:
            return failure(name, "oversize", "over the size cap, not sent", started, request_id)
        nc = self._nc()
        if nc is None or not nc.is_connected:
            return failure(name, "error", "not connected to NATS", started, request_id)
        info = BUILTIN_CLASSIFIERS[name]
        item = ClassifyRequest(texts=list(ex.texts), request_id=request_id, roles=list(ex.roles),
                               unreadable=ex.unreadable,
                               deadline_ms=info.deadline_seconds * 1000.0 * SERVICE_SHARE)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[ClassifyReply] = loop.create_future()
        batch = self._pending.get(name)
        if batch is None:
            batch = self._pending[name] = []
            self._bytes[name] = 0
            loop.call_soon(self._flush, name)
        batch.append((item, fut, started))
        self._bytes[name] += size
        if len(batch) >= self.max_items or self._bytes[name] >= self.max_bytes:
            self._flush(name)
        return await fut

    async def _request(self, subject: str, payload: bytes, timeout: float) -> Any:
        """``nc.request`` that counts a reply as in time when it reached this
        process by the deadline: when the timer fires, the loop may have read
        the reply from the socket in the same turn but not parsed it yet (that
        takes a turn or two more, and a busy loop makes each turn long). The
        wait is still bounded: :data:`GRACE_TURNS` turns of the loop after the
        deadline, then ``TimeoutError``."""
        nc = self._nc()
        fut = asyncio.ensure_future(nc.request(subject, payload, timeout=timeout * 10))
        try:
            done, _ = await asyncio.wait({fut}, timeout=timeout)
            for _ in range(GRACE_TURNS if not done else 0):
                await asyncio.sleep(0)
                if fut.done():
                    break
            if not fut.done():
                raise nats.errors.TimeoutError
            return fut.result()
        finally:
            if not fut.done():
                fut.cancel()

    def _flush(self, name: str) -> None:
        batch = self._pending.pop(name, None)
        self._bytes.pop(name, None)
        if not batch:
            return
        task = asyncio.ensure_future(self._send(name, batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, name: str, batch: list[tuple[ClassifyRequest, asyncio.Future[ClassifyReply], float]]) -> None:
        info = BUILTIN_CLASSIFIERS[name]
        timeout = info.deadline_seconds
        replies: list[ClassifyReply] | None = None
        why = ("error", "")
        try:
            payload = encode(ClassifyBatch(items=[b[0] for b in batch], sent_at=time.time(),
                                           deadline_ms=timeout * 1000.0 * SERVICE_SHARE))
            msg = await self._request(classify_batch_subject(name), payload, timeout)
            got = self._decoder.decode(msg.data).replies
            if len(got) == len(batch):
                replies = got
            else:
                why = ("error", "invalid batch reply")
        except nats.errors.NoRespondersError:
            why = ("error", "no responders")
        except nats.errors.TimeoutError:
            why = ("deadline", "no answer within the deadline")
        except asyncio.CancelledError:
            why = ("error", "cancelled")
            raise
        except Exception as exc:  # connection closed, payload too large, undecodable reply
            why = ("error", type(exc).__name__)
        finally:
            for i, (item, fut, started) in enumerate(batch):
                if fut.done():
                    continue
                reply = replies[i] if replies is not None else None
                # the answer for this item, by its id: a reply in the wrong place is no answer
                if (reply is None or len(reply.tags) != 1 or reply.tags[0] not in info.tags
                        or reply.classifier != name or reply.request_id != item.request_id
                        or (reply.outcome != "ok" and reply.tags[0] != info.failure_tag)):
                    outcome, detail = why if reply is None else ("error", "invalid reply")
                    reply = failure(name, outcome, detail, started, item.request_id)
                fut.set_result(reply)


class Classification:
    """Router-wide classification state: paths, detectors, back-pressure, metrics."""

    def __init__(self, metrics: Any, nc: Any = None, *, max_in_flight: int = 256, batching: bool = True,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.metrics = metrics
        self.nc = nc
        #: one message per classifier per event-loop turn (False: one request each)
        self.batcher: Batcher | None = Batcher(lambda: self.nc) if batching else None
        self.max_in_flight = max_in_flight
        self.clock = clock
        self.pressure = {n: Pressure(n, max_limit=max_in_flight, clock=clock) for n in BUILTIN_CLASSIFIERS}
        self._detectors: Any = None
        self._loading: Any = None
        r = metrics.registry
        self.misses = Counter("kinference_classifier_deadline_misses_total",
                              "Classify requests that got no answer within their deadline (failure tag used)",
                              ["classifier", "path"], registry=r)
        self.shed = Counter("kinference_classifier_shed_total",
                            "Classify requests not sent because the classifier's backlog was over its "
                            "in-flight limit (failure tag used at once)", ["classifier"], registry=r)
        self.skipped = Counter("kinference_classifier_skipped_total",
                               "Required classifiers not asked because their answer could not change the "
                               "decision", ["classifier"], registry=r)
        self.overloaded = Gauge("kinference_classifier_overloaded",
                                "1 while a classifier misses its deadline for a sustained period", ["classifier"],
                                registry=r)
        self.limit = Gauge("kinference_classifier_in_flight_limit",
                           "Classify requests this router lets be in flight (adapts to deadline misses)",
                           ["classifier"], registry=r)
        for n, p in self.pressure.items():
            self.limit.labels(n).set(p.limit)
            self.overloaded.labels(n).set(0)

    @classmethod
    def shared(cls, metrics: Any, nc: Any = None) -> Classification:
        """The one instance for ``metrics`` (routers of several pools in one
        process share their metrics, so they share classification state and
        its back-pressure too)."""
        got = _SHARED.get(metrics)
        if got is None:
            got = _SHARED[metrics] = cls(metrics, nc)
        return got

    def start(self, req: Request, body: Any, decision_id: str) -> RequestTags:
        return RequestTags(self, req, body, decision_id)

    # --------------------------------------------------------------- paths

    def path(self, snap: Snapshot, name: str) -> str:
        return IN_PROCESS if name in snap.pool.policy.in_process_classifiers else SERVICE

    def detectors(self) -> Any:
        """The pattern detectors, or None while they load: compiling them
        takes most of a second, so it happens in a thread when a snapshot
        first runs a classifier in process (:meth:`prepare`), never on the
        event loop; until then such a request gets the failure tag."""
        if self._detectors is None and self._loading is None:
            try:
                self._loading = asyncio.get_running_loop().run_in_executor(None, self._load)
            except RuntimeError:  # no event loop (a synchronous caller): load here
                self._loading = True
                self._load()
        return self._detectors

    def _load(self) -> None:
        from kinference_common.detectors.core import Classifiers

        detectors = Classifiers()
        detectors.warm_up()
        self._detectors = detectors
        log.info("in-process classifiers loaded", classifiers=detectors.names)

    def prepare(self, snap: Snapshot | None) -> None:
        """Start loading the detectors when ``snap`` runs a classifier in process."""
        if snap is not None and snap.pool.policy.in_process_classifiers and self._detectors is None:
            self.detectors()

    def ready(self, snap: Snapshot | None) -> bool:
        """False while ``snap`` runs a classifier in process that is still loading."""
        if snap is None or not snap.pool.policy.in_process_classifiers:
            return True
        return self.detectors() is not None

    def watch(self, keeper: Any) -> None:
        """Call :meth:`prepare` after each snapshot rebuild of ``keeper``."""
        before = keeper.on_rebuild

        def rebuilt() -> None:
            self.prepare(keeper.snapshot)
            if before is not None:
                before()

        keeper.on_rebuild = rebuilt

    async def ask(self, snap: Snapshot, names: Sequence[str], body: Any,
                  decision_id: str) -> tuple[frozenset[str], list[ClassifierTrace]]:
        """Each of ``names`` on its path, in parallel; failure tags for what fails."""
        started = time.perf_counter()
        results: list[tuple[str, Any, float, str, str]] = []
        remote = []
        for name in names:
            path = self.path(snap, name)
            if path == IN_PROCESS:
                t0 = time.perf_counter()
                ex = texts_from_body(body.raw)
                info = BUILTIN_CLASSIFIERS[name]
                detectors = self.detectors()
                if detectors is None:
                    reply = failure(name, "error", "in-process classifier still loading", t0, decision_id)
                    results.append((name, reply, 0.0, path, "the in-process detectors are still loading "
                                                            "(just after start): failure tag used"))
                    continue
                try:
                    reply = detectors.classify(name, ex.texts, roles=ex.roles, unreadable=ex.unreadable,
                                               deadline_ms=info.deadline(IN_PROCESS) * 1e3, request_id=decision_id)
                except Exception as exc:  # a detector bug: fail closed, never a 500
                    reply = failure(name, "error", type(exc).__name__, t0, decision_id)
                    log.warning("in-process classifier raised: failure tag used", classifier=name,
                                error=type(exc).__name__)
                results.append((name, reply, time.perf_counter() - t0, path, ""))
            elif not self.pressure[name].admit():
                self.shed.labels(name).inc()
                p = self.pressure[name]
                reply = failure(name, "shed", "backlog over the in-flight limit", started, decision_id)
                results.append((name, reply, 0.0, path,
                                f"not sent: {p.in_flight} requests to it in flight, over its limit of "
                                f"{int(p.limit)} (it is missing its deadline); failure tag used"))
            else:
                remote.append(name)

        async def one(name: str) -> tuple[str, Any, float, str, str]:
            t0 = time.perf_counter()
            try:
                if self.batcher is not None:
                    reply = await self.batcher.classify(name, body.raw, decision_id)
                else:
                    reply = await classify_body(self.nc, name, body.raw,
                                                BUILTIN_CLASSIFIERS[name].deadline_seconds, request_id=decision_id)
            except Exception as exc:  # a bug on the way: fail closed (the answer path gives the slot back)
                reply = failure(name, "error", type(exc).__name__, t0, decision_id)
                log.warning("classify request raised: failure tag used", classifier=name, error=type(exc).__name__)
            except BaseException:  # the client went away: give its slot back
                self.pressure[name].in_flight -= 1
                raise
            seconds = time.perf_counter() - t0
            self._answered(name, reply.outcome)
            return name, reply, seconds, SERVICE, ""

        if remote:
            results += await asyncio.gather(*(one(n) for n in remote))
        tags: set[str] = set()
        traces = []
        order = {n: i for i, n in enumerate(names)}
        for name, reply, seconds, path, why in sorted(results, key=lambda r: order[r[0]]):
            tags.update(reply.tags)
            tagged = getattr(self.metrics, "tags", None)  # kinference_classifier_tags_total, where the metrics have it
            if tagged is not None:
                tagged(name, reply.tags)
            self.metrics.classifier.labels(name, reply.outcome).observe(seconds)
            if reply.outcome == "deadline":
                self.misses.labels(name, path).inc()
            traces.append(ClassifierTrace(name=name, ms=round(seconds * 1e3, 3), outcome=reply.outcome,
                                          path=path, tags=list(reply.tags), why=why))
        return frozenset(tags), traces

    def _answered(self, name: str, outcome: str) -> None:
        p = self.pressure[name]
        p.answered(outcome == "deadline")
        self.limit.labels(name).set(p.limit)
        over, line = p.check()
        if line is not None:
            self.overloaded.labels(name).set(1 if over else 0)
            answers, misses, shed = p.rate()
            rate = misses / answers if answers else 0.0
            if line == "end":
                log.info("classifier keeps its deadline again", classifier=name,
                         miss_rate=round(rate, 3), answers=answers, window_seconds=p.window)
            else:
                log.warning("classifier missing its deadline", classifier=name, miss_rate=round(rate, 3),
                            missed=misses, answers=answers, shed=shed, window_seconds=p.window,
                            deadline_ms=round(p.deadline * 1e3, 1), in_flight_limit=int(p.limit),
                            effect="late and shed requests get the failure tag: they stay local")


def configure(c: Classification, *, batching: bool = True, max_in_flight: int = 256) -> None:
    """Apply the router's command-line choices."""
    if not batching:
        c.batcher = None
    c.max_in_flight = max_in_flight
    for p in c.pressure.values():
        p.max_limit = max_in_flight
        p.limit = float(max_in_flight)
        c.limit.labels(p.name).set(p.limit)


_SHARED: weakref.WeakKeyDictionary[Any, Classification] = weakref.WeakKeyDictionary()


class RequestTags:
    """One request's tags: asked for when (and only when) they matter."""

    def __init__(self, owner: Classification, req: Request, body: Any, decision_id: str) -> None:
        self.owner = owner
        #: the request with the tags known so far
        self.req = req
        self.body = body
        self.decision_id = decision_id
        #: classifier names asked so far
        self.known: set[str] = set()
        #: what the trace shows: classifiers asked (with timings) and skipped (with why)
        self.traces: list[ClassifierTrace] = []
        self._skipped: dict[str, ClassifierTrace] = {}

    @classmethod
    def supplied(cls, owner: Classification, req: Request, body: Any, tags: frozenset[str]) -> RequestTags:
        """Tags given by the caller (explain with ``tags``): nothing is asked."""
        self = cls(owner, msgspec.structs.replace(req, tags=tags), body, "explain")
        self.known = set(BUILTIN_CLASSIFIERS)
        return self

    async def _ask(self, snap: Snapshot, names: list[str]) -> None:
        tags, traces = await self.owner.ask(snap, names, self.body, self.decision_id)
        self.req = msgspec.structs.replace(self.req, tags=self.req.tags | tags)
        self.known.update(names)
        for name in names:
            self._skipped.pop(name, None)
        self.traces = [t for t in self.traces if t.name not in names] + traces

    async def decide(self, snap: Snapshot, avoid: set[str] | frozenset[str],
                     eager: Callable[[Request, Snapshot, Any], Decision], *, ledger: InFlightLedger | None,
                     prefix: PrefixIndex | None, rng: Any,
                     observe: Callable[[float], None] | None = None,
                     latest: Callable[[], Snapshot | None] | None = None) -> Decision:
        """The decision on ``snap``, asking only the classifiers whose answer
        can change it; exactly the decision the request would get with every
        tag known (see :mod:`kinference_common.engine.lazy`). ``eager(req,
        snap, avoid)`` decides when every required tag is known (the common
        case of a policy that reads no tags). After waiting for a classifier
        the decision is taken on ``latest()`` (the newest snapshot) when
        given: ``Decision.snapshot`` says which."""
        needed = snap.classifiers_for(self.req)
        # each turn either decides or asks at least one classifier not asked yet
        for _ in range(len(BUILTIN_CLASSIFIERS) + 2):
            if all(n in self.known for n in needed):
                return eager(self.req, snap, avoid)
            started = time.perf_counter()
            got = decide_lazily(snap, self.req, needed, known=self.known, ledger=ledger, prefix=prefix,
                                rng=rng, avoid=avoid)
            if observe is not None:
                observe(time.perf_counter() - started)
            if got.decision is not None:
                for name, why in got.skipped.items():
                    if name not in self._skipped:
                        self.owner.skipped.labels(name).inc()
                    self._skipped[name] = ClassifierTrace(name=name, ms=0.0, outcome="skipped",
                                                          path=self.owner.path(snap, name), why=why)
                self.traces = [t for t in self.traces if t.name not in got.skipped] + [
                    self._skipped[n] for n in got.skipped]
                return got.decision
            await self._ask(snap, got.needed)
            snap = (latest() if latest is not None else None) or snap
            needed = snap.classifiers_for(self.req)
        raise AssertionError("lazy decision did not converge")  # pragma: no cover - decide_lazily guarantees it

    def fail_closed(self, snap: Snapshot) -> Request:
        """The request as a decision that cannot await sees it on ``snap``:
        every classifier ``snap`` requires that was not asked counts as
        failed (its failure tag). Flow control decides a waiting request
        again on each newer snapshot; one whose policy requires a classifier
        the request's first snapshot did not must not route as if its tags
        were absent (the router never fails open)."""
        missing = [n for n in snap.classifiers_for(self.req) if n not in self.known and n in BUILTIN_CLASSIFIERS]
        if not missing:
            return self.req
        return msgspec.structs.replace(
            self.req, tags=self.req.tags | frozenset(BUILTIN_CLASSIFIERS[n].failure_tag for n in missing))

    async def complete(self, snap: Snapshot) -> Request:
        """Ask every required classifier not asked yet (before the request
        waits in flow control, where it is decided again without awaiting)."""
        missing = [n for n in snap.classifiers_for(self.req) if n not in self.known]
        if missing:
            await self._ask(snap, missing)
        return self.req
