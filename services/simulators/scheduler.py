"""The vLLM V1 scheduler as a pure, clock-injected step loop.

No I/O, no sleeping, no randomness: :meth:`Scheduler.step` is given the
current (simulated) time, plans one engine step, and returns what the step
produced and how long it took on the GPU profile. Callers decide how time
passes (an asyncio loop sleeping in real or accelerated time, or an offline
loop that just adds the durations).

One step, as in vLLM V1 (FCFS policy):

1. Running requests first, oldest first. Each asks for the tokens it still
   lacks (``num_tokens - num_computed``: a chunk of its prefill, capped by the
   step's token budget, or 1 for a decode). When its KV blocks cannot grow,
   the *newest* running request is preempted (its blocks freed, progress
   dropped, put at the front of the waiting queue) until they can; if the
   newest is the request itself, it is preempted and the pass stops.
2. If nothing was preempted, waiting requests are admitted in order while the
   budget, the sequence cap (``max_num_seqs``) and free KV blocks allow. On
   admission the longest cached prefix of the prompt's full blocks is reused
   (at least one token is always computed), and only the rest is prefilled.
3. The step costs ``profile.step_seconds(...)``; uncached prefill tokens cost,
   cached ones do not. A request whose tokens are all computed at the end of
   the step emits one token (the last prefill chunk emits the first token).
   Full prompt blocks become findable in the prefix cache once computed.

A preempted request keeps its output so far; on resumption its prompt *and*
output are recomputed (its prompt blocks may still be cached).
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from .kvcache import BlockPool
from .profiles import SpeedProfile


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    num_gpu_blocks: int
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: int = 8192
    enable_prefix_caching: bool = True

    def __post_init__(self) -> None:
        for name in (
            "num_gpu_blocks",
            "block_size",
            "max_num_seqs",
            "max_num_batched_tokens",
            "max_model_len",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if self.num_gpu_blocks * self.block_size < self.max_model_len:
            raise ValueError(
                f"KV cache ({self.num_gpu_blocks} blocks x {self.block_size} tokens) is smaller "
                f"than max_model_len {self.max_model_len}"
            )

    @property
    def kv_capacity_tokens(self) -> int:
        return self.num_gpu_blocks * self.block_size


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class SimRequest:
    request_id: str
    prompt_tokens: int
    block_hashes: tuple[bytes, ...]
    #: tokens this request will generate before it stops
    output_len: int
    #: "stop" (end of sequence) or "length" (max_tokens reached)
    finish_reason: str
    arrival: float
    status: Status = Status.WAITING
    num_computed: int = 0
    num_output: int = 0
    blocks: list[int] = field(default_factory=list)
    num_registered: int = 0
    #: prefix-cache hit at first admission, in tokens (-1 before)
    num_cached_tokens: int = -1
    first_scheduled: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    preemptions: int = 0

    @property
    def num_tokens(self) -> int:
        return self.prompt_tokens + self.num_output

    @property
    def remaining_prefill(self) -> int:
        """Tokens to compute before the next token can be sampled (0 when decoding)."""
        left = self.num_tokens - self.num_computed
        return left if self.num_output == 0 or left > 1 else 0


@dataclass(frozen=True, slots=True)
class TokenEvent:
    request_id: str
    #: 0 for the first output token
    index: int
    time: float
    #: seconds since the previous token; for the first token, since arrival (the TTFT)
    latency: float
    #: set on the request's last token
    finish_reason: str | None = None


@dataclass(frozen=True, slots=True)
class FinishedRequest:
    request_id: str
    finish_reason: str
    arrival: float
    first_scheduled: float
    first_token: float | None
    finished: float
    prompt_tokens: int
    output_tokens: int
    cached_tokens: int
    preemptions: int

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.arrival

    @property
    def queue_time(self) -> float:
        return self.first_scheduled - self.arrival

    @property
    def prefill_time(self) -> float:
        return (self.first_token or self.finished) - self.first_scheduled

    @property
    def e2e(self) -> float:
        return self.finished - self.arrival


@dataclass(frozen=True, slots=True)
class StepResult:
    start: float
    duration: float
    tokens: list[TokenEvent]
    finished: list[FinishedRequest]
    preempted: list[str]
    admitted: list[str]
    prefill_tokens: int
    decode_seqs: int
    #: KV tokens the step's decodes attended to (what the step paid per context token)
    decode_context_tokens: int = 0

    @property
    def end(self) -> float:
        return self.start + self.duration

    @property
    def idle(self) -> bool:
        return self.duration == 0.0


@dataclass(slots=True)
class Counters:
    """Monotonic totals, as vLLM's counters count them."""

    prompt_tokens: int = 0
    prompt_tokens_cached: int = 0
    generation_tokens: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    preemptions: int = 0
    steps: int = 0
    busy_seconds: float = 0.0


class Scheduler:
    def __init__(self, config: SchedulerConfig, profile: SpeedProfile) -> None:
        self.config = config
        self.profile = profile
        self.pool = BlockPool(config.num_gpu_blocks)
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.counters = Counters()
        self._by_id: dict[str, SimRequest] = {}

    # ------------------------------------------------------------ requests

    def add_request(
        self,
        request_id: str,
        prompt_tokens: int,
        block_hashes: Sequence[bytes],
        output_len: int,
        finish_reason: str,
        now: float,
    ) -> SimRequest:
        if request_id in self._by_id:
            raise ValueError(f"duplicate request id {request_id!r}")
        if prompt_tokens <= 0 or output_len <= 0:
            raise ValueError("prompt_tokens and output_len must be positive")
        if prompt_tokens + output_len > self.config.max_model_len:
            raise ValueError(
                f"{prompt_tokens} prompt + {output_len} output tokens exceed max_model_len "
                f"{self.config.max_model_len}"
            )
        usable = (prompt_tokens - 1) // self.config.block_size
        req = SimRequest(
            request_id=request_id,
            prompt_tokens=prompt_tokens,
            block_hashes=tuple(block_hashes[:usable]),
            output_len=output_len,
            finish_reason=finish_reason,
            arrival=now,
        )
        self.waiting.append(req)
        self._by_id[request_id] = req
        return req

    def abort(self, request_id: str, now: float) -> FinishedRequest | None:
        """Drop a request (client went away); its KV is freed. None if unknown/finished."""
        req = self._by_id.pop(request_id, None)
        if req is None:
            return None
        if req.status is Status.RUNNING:
            self.running.remove(req)
        else:
            self.waiting.remove(req)
        self.pool.free(req.blocks)
        req.blocks = []
        req.status = Status.FINISHED
        return self._finished(req, "abort", now)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def kv_usage(self) -> float:
        return self.pool.usage()

    def queued_prefill_tokens(self) -> int:
        """Prompt tokens still to prefill over waiting and running requests (cache ignored)."""
        return sum(r.remaining_prefill for r in self.waiting) + sum(
            r.remaining_prefill for r in self.running
        )

    # ----------------------------------------------------------------- step

    def step(self, now: float) -> StepResult:
        cfg = self.config
        budget = cfg.max_num_batched_tokens
        scheduled: list[tuple[SimRequest, int]] = []
        preempted: list[str] = []
        admitted: list[str] = []

        # 1. running requests, oldest first
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = min(req.num_tokens - req.num_computed, budget)
            self_preempted = False
            while not self._grow(req, req.num_computed + n):
                victim = self.running.pop()
                self._preempt(victim)
                preempted.append(victim.request_id)
                if victim is req:
                    self_preempted = True
                    break
            if self_preempted:
                break
            scheduled.append((req, n))
            budget -= n
            i += 1

        # 2. waiting requests, unless this step had to preempt
        if not preempted:
            while self.waiting and budget > 0 and len(self.running) < cfg.max_num_seqs:
                req = self.waiting[0]
                n = self._admit(req, budget, now)
                if n == 0:
                    break
                self.waiting.popleft()
                self.running.append(req)
                scheduled.append((req, n))
                admitted.append(req.request_id)
                budget -= n

        # 3. cost, then advance
        prefill_tokens = 0
        decode_seqs = 0
        decode_context = 0
        for req, n in scheduled:
            if req.num_output > 0 and req.num_computed == req.num_tokens - 1:
                decode_seqs += 1
                decode_context += req.num_tokens
            else:
                prefill_tokens += n
        duration = self.profile.step_seconds(prefill_tokens, decode_seqs, decode_context)
        end = now + duration

        tokens: list[TokenEvent] = []
        finished: list[FinishedRequest] = []
        for req, n in scheduled:
            req.num_computed += n
            self._register_blocks(req)
            if req.num_computed < req.num_tokens:
                continue
            req.num_output += 1
            latency = end - (req.arrival if req.last_token is None else req.last_token)
            if req.first_token is None:
                req.first_token = end
                cached = max(req.num_cached_tokens, 0)
                self.counters.prompt_tokens += req.prompt_tokens
                self.counters.prompt_tokens_cached += cached
            req.last_token = end
            self.counters.generation_tokens += 1
            done = req.num_output >= req.output_len
            reason = req.finish_reason if done else None
            tokens.append(TokenEvent(req.request_id, req.num_output - 1, end, latency, reason))
            if done:
                req.status = Status.FINISHED
                self.pool.free(req.blocks)
                req.blocks = []
                del self._by_id[req.request_id]
                finished.append(self._finished(req, req.finish_reason, end))
        if finished:
            self.running = [r for r in self.running if r.status is Status.RUNNING]

        if scheduled:
            self.counters.steps += 1
            self.counters.busy_seconds += duration
        self.counters.preemptions += len(preempted)
        return StepResult(
            start=now,
            duration=duration,
            tokens=tokens,
            finished=finished,
            preempted=preempted,
            admitted=admitted,
            prefill_tokens=prefill_tokens,
            decode_seqs=decode_seqs,
            decode_context_tokens=decode_context,
        )

    # -------------------------------------------------------------- helpers

    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.config.block_size)

    def _grow(self, req: SimRequest, total_tokens: int) -> bool:
        need = self._blocks_for(total_tokens) - len(req.blocks)
        if need <= 0:
            return True
        new = self.pool.allocate(need)
        if new is None:
            return False
        req.blocks.extend(new)
        return True

    def _admit(self, req: SimRequest, budget: int, now: float) -> int:
        """Give ``req`` its cached prefix and blocks for its first chunk; tokens scheduled or 0."""
        bs = self.config.block_size
        cached = (
            self.pool.lookup_prefix(req.block_hashes) if self.config.enable_prefix_caching else []
        )
        num_cached = len(cached) * bs
        n = min(req.num_tokens - num_cached, budget)
        need = self._blocks_for(num_cached + n) - len(cached)
        if need > self.pool.free_after_touch(cached):
            return 0
        self.pool.touch(cached)
        new = self.pool.allocate(need)
        assert new is not None
        req.blocks = cached + new
        req.num_computed = num_cached
        req.num_registered = len(cached)
        req.status = Status.RUNNING
        if req.first_scheduled is None:
            req.first_scheduled = now
        if req.num_cached_tokens < 0:
            req.num_cached_tokens = num_cached
        self.counters.prefix_cache_queries += req.num_tokens
        self.counters.prefix_cache_hits += num_cached
        return n

    def _register_blocks(self, req: SimRequest) -> None:
        if not self.config.enable_prefix_caching:
            return
        full = min(req.num_computed // self.config.block_size, len(req.block_hashes))
        for j in range(req.num_registered, full):
            self.pool.cache(req.blocks[j], req.block_hashes[j])
        req.num_registered = max(req.num_registered, full)

    def _preempt(self, req: SimRequest) -> None:
        self.pool.free(req.blocks)
        req.blocks = []
        req.num_computed = 0
        req.num_registered = 0
        req.status = Status.WAITING
        req.preemptions += 1
        self.waiting.appendleft(req)

    def _finished(self, req: SimRequest, reason: str, now: float) -> FinishedRequest:
        return FinishedRequest(
            request_id=req.request_id,
            finish_reason=reason,
            arrival=req.arrival,
            first_scheduled=req.first_scheduled if req.first_scheduled is not None else now,
            first_token=req.first_token,
            finished=now,
            prompt_tokens=req.prompt_tokens,
            output_tokens=req.num_output,
            cached_tokens=max(req.num_cached_tokens, 0),
            preemptions=req.preemptions,
        )
