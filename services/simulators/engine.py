"""The asyncio driver of the scheduler: real or accelerated time, token streams.

:class:`Engine` runs :meth:`Scheduler.step` in a background task and sleeps
each step's duration divided by ``time_scale`` (simulated seconds per real
second), sleeping until an absolute deadline so time does not drift. Each
submitted request gets a :class:`TokenStream` fed by the step results.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

from .scheduler import Scheduler, TokenEvent
from .vllm_metrics import EngineSeries


@dataclass(eq=False)
class TokenStream:
    request_id: str
    queue: asyncio.Queue[TokenEvent] = field(default_factory=asyncio.Queue)
    done: bool = False
    #: prompt tokens the prefix cache held at admission, set when the request finishes
    cached_tokens: int | None = None

    async def events(self) -> AsyncIterator[TokenEvent]:
        while not self.done:
            ev = await self.queue.get()
            if ev.finish_reason is not None:
                self.done = True
            yield ev


class Engine:
    def __init__(
        self,
        scheduler: Scheduler,
        metrics: EngineSeries,
        *,
        time_scale: float = 1.0,
        clock: Callable[[], float] | None = None,
    ) -> None:
        if time_scale <= 0:
            raise ValueError("time_scale must be positive")
        self.scheduler = scheduler
        self.metrics = metrics
        self.time_scale = time_scale
        self._clock = clock or asyncio.get_running_loop().time
        self._real_t0 = self._clock()
        self._wake = asyncio.Event()
        self._streams: dict[str, TokenStream] = {}
        self._last_end = 0.0
        self.metrics.sync(scheduler)

    def sim_now(self) -> float:
        """Simulated seconds since the engine started."""
        return max((self._clock() - self._real_t0) * self.time_scale, 0.0)

    def submit(
        self,
        request_id: str,
        prompt_tokens: int,
        block_hashes: Sequence[bytes],
        output_len: int,
        finish_reason: str,
    ) -> TokenStream:
        self.scheduler.add_request(
            request_id, prompt_tokens, block_hashes, output_len, finish_reason, self.sim_now()
        )
        stream = TokenStream(request_id)
        self._streams[request_id] = stream
        self.metrics.sync(self.scheduler)
        self._wake.set()
        return stream

    def abort(self, request_id: str) -> None:
        stream = self._streams.pop(request_id, None)
        if stream is not None:
            stream.done = True
        finished = self.scheduler.abort(request_id, self.sim_now())
        if finished is not None:
            self.metrics.observe_finished(finished)
            self.metrics.sync(self.scheduler)

    async def run(self) -> None:
        sched = self.scheduler
        while True:
            if not sched.has_work():
                self._wake.clear()
                await self._wake.wait()
                continue
            now = max(self.sim_now(), self._last_end)
            result = sched.step(now)
            self._last_end = result.end
            self.metrics.sync(sched)  # gauges show the batch while it runs
            delay = self._real_t0 + result.end / self.time_scale - self._clock()
            await asyncio.sleep(max(0, delay))
            if result.idle:  # work that cannot be scheduled yet; should not happen
                await asyncio.sleep(0.001)
            for f in result.finished:
                stream = self._streams.get(f.request_id)
                if stream is not None:
                    stream.cached_tokens = f.cached_tokens
            for ev in result.tokens:
                stream = self._streams.get(ev.request_id)
                if stream is not None:
                    stream.queue.put_nowait(ev)
                    if ev.finish_reason is not None:
                        del self._streams[ev.request_id]
            self.metrics.observe_step(result)
            self.metrics.sync(sched)

    def state(self) -> dict[str, float | int]:
        """Load as the DCGM simulator polls it (``GET /sim/state``)."""
        s = self.scheduler
        return {
            "sim_time": self.sim_now(),
            "busy_seconds": s.counters.busy_seconds,
            "steps": s.counters.steps,
            "running": s.num_running,
            "waiting": s.num_waiting,
            "kv_cache_usage": s.kv_usage(),
            "num_gpu_blocks": s.config.num_gpu_blocks,
            "block_size": s.config.block_size,
            "queued_prefill_tokens": s.queued_prefill_tokens(),
            "preemptions": s.counters.preemptions,
            "generation_tokens": s.counters.generation_tokens,
            "time_scale": self.time_scale,
        }
