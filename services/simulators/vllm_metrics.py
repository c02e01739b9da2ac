"""The engine simulator's ``/metrics``: vLLM's V1 metric names, types, labels, buckets.

One :class:`prometheus_client.CollectorRegistry` per simulator instance
(:class:`EngineMetrics`, the page), with one :class:`EngineSeries` per
engine core (label ``engine``: "0", "1", ... under data parallelism).
Counters are brought up to the scheduler's totals after every step
(:meth:`EngineSeries.sync`); histograms are observed per token and per
finished request, in *simulated* seconds (what a real engine would report).
Like vLLM, ``vllm:cache_config_info`` carries the cache config as labels
plus ``engine`` (no ``model_name``). With ``legacy=True`` the names vLLM
deprecated are exposed too (``vllm:gpu_cache_usage_perc``,
``vllm:gpu_prefix_cache_*``, ``vllm:time_per_output_token_seconds``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import astuple

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from .scheduler import Counters, FinishedRequest, Scheduler, StepResult

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
REQUEST_LATENCY_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
FINISH_REASONS = ("stop", "length", "abort")


def buckets_1_2_5(max_value: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50, ... up to ``max_value`` (vLLM's token-count buckets)."""
    out: list[int] = []
    scale = 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_value:
                return tuple(out)
            out.append(m * scale)
        scale *= 10


class EngineMetrics:
    """The metric families of one simulator and its rendered page."""

    def __init__(
        self,
        *,
        model_name: str,
        max_model_len: int,
        cache_info: dict[str, str],
        pod: str = "",
        profile: str = "",
        legacy: bool = False,
        min_render_interval: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.model_name = model_name
        self.cache_info = cache_info
        self.legacy = legacy
        r = self.registry
        ln = ["model_name", "engine"]
        tok_buckets = tuple(float(b) for b in buckets_1_2_5(max_model_len))

        def gauge(name: str, doc: str, extra: tuple[str, ...] = ()) -> Gauge:
            return Gauge(name, doc, [*ln, *extra], registry=r)

        def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, [*ln, *extra], registry=r)

        def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, ln, buckets=buckets, registry=r)

        self.running = gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches."
        )
        self.waiting = gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed."
        )
        self.waiting_by_reason = gauge(
            "vllm:num_requests_waiting_by_reason",
            "Number of requests waiting to be processed, by reason.",
            ("reason",),
        )
        self.kv_usage = gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."
        )
        # like vLLM: the cache config as labels, plus engine (no model_name)
        self.cache_config_info = Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            [*cache_info, "engine"],
            registry=r,
        )
        self.prefix_queries = counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
        )
        self.prefix_hits = counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        )
        self.preemptions = counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine."
        )
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.prompt_by_source = counter(
            "vllm:prompt_tokens_by_source", "Number of prompt tokens by source.", ("source",)
        )
        self.generation_tokens = counter(
            "vllm:generation_tokens", "Number of generation tokens processed."
        )
        self.success = counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            ("finished_reason",),
        )
        self.ttft = hist(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            TTFT_BUCKETS,
        )
        self.itl = hist(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            ITL_BUCKETS,
        )
        self.e2e = hist(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.queue_time = hist(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.inference_time = hist(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.prefill_time = hist(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.decode_time = hist(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.req_prompt_tokens = hist(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", tok_buckets
        )
        self.req_generation_tokens = hist(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", tok_buckets
        )
        self.req_kv_computed = hist(
            "vllm:request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
            tok_buckets,
        )
        self.iteration_tokens = hist(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            tuple(float(b) for b in ITERATION_TOKEN_BUCKETS),
        )
        if legacy:
            self.gpu_cache_usage = gauge(
                "vllm:gpu_cache_usage_perc",
                "GPU KV-cache usage. 1 means 100 percent usage."
                "DEPRECATED: Use vllm:kv_cache_usage_perc instead.",
            )
            self.gpu_prefix_queries = counter(
                "vllm:gpu_prefix_cache_queries", "GPU prefix cache queries. DEPRECATED."
            )
            self.gpu_prefix_hits = counter(
                "vllm:gpu_prefix_cache_hits", "GPU prefix cache hits. DEPRECATED."
            )
            self.tpot = hist(
                "vllm:time_per_output_token_seconds",
                "Histogram of time per output token in seconds.",
                ITL_BUCKETS,
            )
        sim_info = Gauge(
            "kinference_sim_info",
            "Simulator identity (not a vLLM metric).",
            ["model_name", "pod", "profile"],
            registry=r,
        )
        sim_info.labels(model_name, pod, profile).set(1)

        self.version = 0
        self._rendered_version = -1
        self._rendered = b""
        self._rendered_at = float("-inf")
        self._min_render_interval = min_render_interval
        self._clock = clock

    def engine(self, label: str) -> EngineSeries:
        """The series of engine core ``label`` (created on first use)."""
        return EngineSeries(self, label)

    def render(self) -> bytes:
        """The exposition text, re-rendered only when something changed.

        Rendering a page with histograms costs about 2 ms; with
        ``min_render_interval`` a busy engine re-renders at most that often
        (the page may then be that many real seconds old).
        """
        if self._rendered_version != self.version:
            now = self._clock()
            if now - self._rendered_at >= self._min_render_interval:
                self._rendered = generate_latest(self.registry)
                self._rendered_version = self.version
                self._rendered_at = now
        return self._rendered


class EngineSeries:
    """One engine core's children of every family, kept in step with its scheduler."""

    def __init__(self, page: EngineMetrics, label: str) -> None:
        self.page = page
        self.label = label
        lv = (page.model_name, label)
        self.running = page.running.labels(*lv)
        self.waiting = page.waiting.labels(*lv)
        self.waiting_capacity = page.waiting_by_reason.labels(*lv, "capacity")
        page.waiting_by_reason.labels(*lv, "deferred").set(0)
        self.kv_usage = page.kv_usage.labels(*lv)
        page.cache_config_info.labels(**page.cache_info, engine=label).set(1)
        self.prefix_queries = page.prefix_queries.labels(*lv)
        self.prefix_hits = page.prefix_hits.labels(*lv)
        self.preemptions = page.preemptions.labels(*lv)
        self.prompt_tokens = page.prompt_tokens.labels(*lv)
        self.prompt_compute = page.prompt_by_source.labels(*lv, "local_compute")
        self.prompt_cache_hit = page.prompt_by_source.labels(*lv, "local_cache_hit")
        page.prompt_by_source.labels(*lv, "external_kv_transfer")
        self.generation_tokens = page.generation_tokens.labels(*lv)
        self.success = {reason: page.success.labels(*lv, reason) for reason in FINISH_REASONS}
        self.ttft = page.ttft.labels(*lv)
        self.itl = page.itl.labels(*lv)
        self.e2e = page.e2e.labels(*lv)
        self.queue_time = page.queue_time.labels(*lv)
        self.inference_time = page.inference_time.labels(*lv)
        self.prefill_time = page.prefill_time.labels(*lv)
        self.decode_time = page.decode_time.labels(*lv)
        self.req_prompt_tokens = page.req_prompt_tokens.labels(*lv)
        self.req_generation_tokens = page.req_generation_tokens.labels(*lv)
        self.req_kv_computed = page.req_kv_computed.labels(*lv)
        self.iteration_tokens = page.iteration_tokens.labels(*lv)
        self.legacy = page.legacy
        if self.legacy:
            self.gpu_cache_usage = page.gpu_cache_usage.labels(*lv)
            self.gpu_prefix_queries = page.gpu_prefix_queries.labels(*lv)
            self.gpu_prefix_hits = page.gpu_prefix_hits.labels(*lv)
            self.tpot = page.tpot.labels(*lv)
        self._last = Counters()
        page.version += 1

    # ------------------------------------------------------------- updates

    def sync(self, sched: Scheduler) -> None:
        """Bring gauges and counters up to the scheduler's state."""
        self.running.set(sched.num_running)
        self.waiting.set(sched.num_waiting)
        self.waiting_capacity.set(sched.num_waiting)
        usage = sched.kv_usage()
        self.kv_usage.set(usage)
        c = sched.counters
        last = self._last
        self._inc(self.prefix_queries, c.prefix_cache_queries - last.prefix_cache_queries)
        self._inc(self.prefix_hits, c.prefix_cache_hits - last.prefix_cache_hits)
        self._inc(self.preemptions, c.preemptions - last.preemptions)
        self._inc(self.prompt_tokens, c.prompt_tokens - last.prompt_tokens)
        cached = c.prompt_tokens_cached - last.prompt_tokens_cached
        self._inc(self.prompt_cache_hit, cached)
        self._inc(self.prompt_compute, c.prompt_tokens - last.prompt_tokens - cached)
        self._inc(self.generation_tokens, c.generation_tokens - last.generation_tokens)
        if self.legacy:
            self.gpu_cache_usage.set(usage)
            self._inc(self.gpu_prefix_queries, c.prefix_cache_queries - last.prefix_cache_queries)
            self._inc(self.gpu_prefix_hits, c.prefix_cache_hits - last.prefix_cache_hits)
        self._last = Counters(*astuple(c))
        self.page.version += 1

    @staticmethod
    def _inc(counter: Counter, delta: float) -> None:
        if delta > 0:
            counter.inc(delta)

    def observe_step(self, result: StepResult) -> None:
        if result.idle:
            return
        self.iteration_tokens.observe(result.prefill_tokens + result.decode_seqs)
        for ev in result.tokens:
            if ev.index == 0:
                self.ttft.observe(ev.latency)
                continue
            self.itl.observe(ev.latency)
            if self.legacy:
                self.tpot.observe(ev.latency)
        for f in result.finished:
            self.observe_finished(f)
        self.page.version += 1

    def observe_finished(self, f: FinishedRequest) -> None:
        self.success.get(f.finish_reason, self.success["abort"]).inc()
        self.e2e.observe(f.e2e)
        self.queue_time.observe(f.queue_time)
        self.inference_time.observe(f.finished - f.first_scheduled)
        self.prefill_time.observe(f.prefill_time)
        self.decode_time.observe(f.finished - (f.first_token or f.finished))
        self.req_prompt_tokens.observe(f.prompt_tokens)
        self.req_generation_tokens.observe(f.output_tokens)
        self.req_kv_computed.observe(f.prompt_tokens - f.cached_tokens)
        self.page.version += 1
