"""Flow control (RESOURCES.md, "Flow control"): on a pool with
``spec.flowControl``, a request rejected as ``no_capacity`` (exclusions on
live signals left no candidate) waits in the pool's queue instead of failing
at once, and is decided again as capacity may have come back.

- **Order.** Higher ``priority`` first; within a priority, flows take turns
  (round robin; a flow is the tenant, or the ``x-gateway-inference-fairness-id``
  header's value); within a flow, oldest first.
- **When a waiter is tried again.** After a snapshot rebuild (telemetry
  changed) every waiter gets a turn, in order; after one of this router's
  requests finishes (one slot freed), waiters get turns in order until one is
  placed. Turns are given one at a time: a placed request has taken its slot
  in the in-flight ledger before the next waiter decides, so one freed slot
  never admits two requests.
- **Outcomes.** A turn that routes leaves the queue and proceeds; one that is
  still ``no_capacity`` keeps its place; any other outcome (the policy now
  rejects it, the model is gone) leaves the queue with that rejection.
- **Full queue.** The lowest-priority, newest request is shed (429
  ``rate_limited``): the arriving one when nothing waiting ranks below it.
- **Time limit.** A request still waiting at ``maxQueueWait`` is rejected as
  ``no_capacity`` (503). A client that goes away leaves the queue.

- **No cutting in line.** A request that would route on arrival while
  requests for the same model, of its priority or higher, are waiting joins
  the queue instead (``capacity_seen``): the capacity it saw goes to
  whoever is first in dispatch order, which may be itself. It brings one
  placement with it, so the number of requests placed is the same as if it
  had gone straight through; only the order follows the rules above. It
  passes that placement on however it leaves (placed, shed, timed out,
  gone). Without this, a request arriving between a slot being freed and
  the dispatcher's turn would take the slot, and under sustained load the
  queued requests would starve until ``maxQueueWait``. Requests for another
  model go straight through: waiters for a saturated model do not compete
  for an idle model's endpoints (the model is the request's canonical
  model, a cheap stand-in for "the same candidates"). So do requests of a
  higher priority than every waiter for their model, and retries after a
  refused connection.

Decisions where the spec is silent: the rule above (the spec says "higher
priority is dispatched first" and fair between flows, which newcomers
overtaking the queue would break); a pool whose configuration drops
``flowControl`` keeps serving the requests already waiting until they are
placed or time out.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator

from kinference_common.compiled import CompiledFlowControl
from kinference_common.engine import Decision
from kinference_common.tasks import cancel_and_wait


class Shed(Exception):
    """The queue was full and this request ranked lowest."""


class QueueTimeout(Exception):
    """The request waited ``maxQueueWait`` without capacity coming back."""


class _Waiter:
    __slots__ = ("priority", "flow", "model", "seq", "turn", "report", "shed")

    def __init__(self, priority: int, flow: str, model: str, seq: int, loop: asyncio.AbstractEventLoop) -> None:
        self.priority = priority
        self.flow = flow
        self.model = model
        self.seq = seq
        #: resolved by the dispatcher: this waiter's turn to decide again
        self.turn: asyncio.Future[None] = loop.create_future()
        #: resolved by the waiter after its turn: True when it was placed
        self.report: asyncio.Future[bool] | None = None
        self.shed = False


class FlowQueue:
    """One pool's queue. ``on_depth(priority, n)`` is told each priority's depth."""

    def __init__(self, on_depth: Callable[[int, int], None] | None = None) -> None:
        #: priority -> flow -> waiters, oldest first; flows in turn order
        self._levels: dict[int, OrderedDict[str, deque[_Waiter]]] = {}
        self._count = 0
        #: model -> priority -> how many wait (no zero entries)
        self._models: dict[str, dict[int, int]] = {}
        self._seq = itertools.count()
        self._on_depth = on_depth
        #: placements the next pass may make (a freed slot adds one; a rebuild: everyone)
        self._budget = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        return self._count

    def start(self) -> None:
        self._task = asyncio.create_task(self._dispatch_loop(), name="flow-control")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)

    # ------------------------------------------------------------ triggers

    def waiting_at_or_above(self, priority: int, model: str) -> bool:
        """Whether a request for ``model`` of ``priority`` arriving now would
        overtake a waiter for the same model."""
        counts = self._models.get(model)
        return counts is not None and max(counts) >= priority

    def slot_freed(self) -> None:
        """One of this router's requests finished: try to place one waiter."""
        if self._count:
            self._budget += 1
            self._wake.set()

    def capacity_changed(self) -> None:
        """The snapshot was rebuilt: every waiter gets a turn."""
        if self._count:
            self._budget = max(self._budget, self._count)
            self._wake.set()

    # ------------------------------------------------------------- waiting

    async def wait(self, priority: int, flow: str, settings: CompiledFlowControl,
                   attempt: Callable[[], Decision], deadline: float | None = None,
                   capacity_seen: bool = False, model: str = "") -> Decision:
        """Queue until ``attempt()`` (a decision on the current snapshot)
        routes or rejects for another reason than capacity; return it.
        ``deadline`` (loop time) defaults to ``maxQueueWait`` from now; a
        request queued again (a retry after a refused connection) passes the
        one it got first, so its whole wait stays within ``maxQueueWait``.
        ``capacity_seen``: the request could have routed and queues only not
        to overtake earlier waiters; one placement is made at once, for the
        first in line (which it passes on even if it never queues).
        ``model``: what the request asks for (see "No cutting in line").
        Raises :class:`Shed` or :class:`QueueTimeout`."""
        loop = asyncio.get_running_loop()
        if capacity_seen:  # the capacity it saw goes to the first in line, whatever happens next
            self._budget += 1
            self._wake.set()
        if deadline is None:
            deadline = loop.time() + settings.max_queue_wait_seconds
        if deadline <= loop.time():
            raise QueueTimeout
        w = _Waiter(priority, flow, model, next(self._seq), loop)
        if self._count >= settings.max_queued:
            victim = self._lowest_newest()
            if victim is None or victim.priority >= priority:
                raise Shed
            self._remove(victim)
            victim.shed = True
            if not victim.turn.done():
                victim.turn.set_result(None)
        self._add(w)
        try:
            async with asyncio.timeout_at(deadline):
                while True:
                    await w.turn
                    if w.shed:
                        raise Shed
                    d = attempt()
                    done = d.routed or d.code != "no_capacity"
                    if done:
                        self._remove(w)
                    else:
                        w.turn = loop.create_future()
                    self._report(w, d.routed)
                    if done:
                        return d
        except TimeoutError:
            raise QueueTimeout from None
        finally:
            self._remove(w)
            self._report(w, False)  # a dispatcher waiting on this turn goes on

    # ------------------------------------------------------------ internals

    @staticmethod
    def _report(w: _Waiter, placed: bool) -> None:
        if w.report is not None and not w.report.done():
            w.report.set_result(placed)

    def _add(self, w: _Waiter) -> None:
        flows = self._levels.setdefault(w.priority, OrderedDict())
        flows.setdefault(w.flow, deque()).append(w)
        self._count += 1
        counts = self._models.setdefault(w.model, {})
        counts[w.priority] = counts.get(w.priority, 0) + 1
        self._depth(w.priority)

    def _remove(self, w: _Waiter) -> None:
        flows = self._levels.get(w.priority)
        queue = flows.get(w.flow) if flows is not None else None
        if queue is None or w not in queue:
            return
        queue.remove(w)
        self._count -= 1
        counts = self._models[w.model]
        counts[w.priority] -= 1
        if not counts[w.priority]:
            del counts[w.priority]
            if not counts:
                del self._models[w.model]
        if not queue:
            del flows[w.flow]  # type: ignore[union-attr]
        if not flows:
            del self._levels[w.priority]
        self._depth(w.priority)

    def _depth(self, priority: int) -> None:
        if self._on_depth is not None:
            flows = self._levels.get(priority)
            self._on_depth(priority, sum(len(q) for q in flows.values()) if flows else 0)

    def _lowest_newest(self) -> _Waiter | None:
        if not self._levels:
            return None
        flows = self._levels[min(self._levels)]
        return max((q[-1] for q in flows.values()), key=lambda w: w.seq)

    def order(self) -> Iterator[_Waiter]:
        """Waiters in dispatch order: priority, then flows in turn, then age."""
        for priority in sorted(self._levels, reverse=True):
            queues = [list(q) for q in self._levels[priority].values()]
            for rank in range(max(len(q) for q in queues)):
                for q in queues:
                    if rank < len(q):
                        yield q[rank]

    def _served(self, w: _Waiter) -> None:
        """Round robin: the flow just served goes to the back of its priority."""
        flows = self._levels.get(w.priority)
        if flows is not None and w.flow in flows:
            flows.move_to_end(w.flow)

    async def _dispatch_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            budget, self._budget = self._budget, 0
            for w in list(self.order()):
                if budget <= 0:
                    break
                if w.turn.done():  # shed, or already on its turn
                    continue
                w.report = loop.create_future()
                w.turn.set_result(None)
                if await w.report:
                    budget -= 1
                    self._served(w)
