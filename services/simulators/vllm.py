"""vLLM engine simulator: ``python -m kinference_simulators.vllm --help``.

An aiohttp server with vLLM's OpenAI-compatible API (``/v1/chat/completions``,
``/v1/completions``, ``/v1/models``), ``POST /tokenize`` (token ids as
:func:`.tokens.token_ids` counts them), ``/health``, ``/metrics`` (vLLM V1
names, labels and buckets) and ``GET /sim/state`` (load as JSON, for the DCGM
simulator), over the step-loop scheduler of :mod:`.scheduler`.

Output: token texts are seeded by ``--seed`` and the prompt, so the same
prompt gets the same answer. A request stops at a natural length (mean
``--output-len-mean``, finish_reason "stop") or at ``max_tokens`` /
``max_completion_tokens`` (default: what ``--max-model-len`` leaves; "length").
vLLM's ``ignore_eos`` and ``min_tokens`` are honoured.

Data parallelism: ``--data-parallel-size N`` runs N engine cores behind one
server, each with its own scheduler and KV cache; requests go to the least
loaded (4 x waiting + running, as vLLM balances) and ``/metrics`` carries one
series per core (``engine="0"``, ``"1"``, ...).

Time: ``--time-scale K`` runs K simulated seconds per real second; latencies
in ``/metrics`` are simulated seconds. ``--slow-start`` is in real seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from aiohttp import web

from . import cli, openai_api, tokens
from .engine import Engine
from .faults import Faults
from .openai_api import ApiError, error_response
from .profiles import get_profile
from .scheduler import Scheduler, SchedulerConfig
from .vllm_metrics import CONTENT_TYPE, EngineMetrics

log = cli.log

#: what ``GET /version`` reports: the vLLM release whose metrics this mimics
VLLM_VERSION = "0.11.0+sim"


@dataclass(frozen=True)
class VllmSimConfig:
    model: str = "meta-llama/Llama-3.1-8B-Instruct"
    served_model_names: tuple[str, ...] = ()
    max_model_len: int = 8192
    kv_blocks: int | None = None
    block_size: int = 16
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enable_prefix_caching: bool = True
    speed_profile: str = "h100"
    time_scale: float = 1.0
    seed: int = 0
    output_len_mean: float = 128.0
    error_rate: float = 0.0
    hang_rate: float = 0.0
    slow_start: float = 0.0
    pod_name: str = ""
    #: engine cores, each with its own scheduler and KV cache (label engine="0", "1", ...)
    data_parallel_size: int = 1
    legacy_metrics: bool = False
    #: report ``usage.prompt_tokens_details.cached_tokens`` (vLLM's
    #: ``--enable-prompt-tokens-details``): the prompt tokens its prefix cache held
    prompt_tokens_details: bool = False
    #: ``system_fingerprint`` of every answer (OpenAI's field naming the
    #: backend that answered; vLLM leaves it out): lets a benchmark's client
    #: tell which pod served a request behind a router
    system_fingerprint: str = ""
    #: real seconds between two renderings of /metrics while the engine is busy
    metrics_min_interval: float = 0.01

    @property
    def served(self) -> tuple[str, ...]:
        return self.served_model_names or (self.model,)

    def scheduler_config(self) -> SchedulerConfig:
        profile = get_profile(self.speed_profile)
        return SchedulerConfig(
            num_gpu_blocks=self.kv_blocks or profile.kv_blocks,
            block_size=self.block_size,
            max_num_seqs=self.max_num_seqs or profile.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens or profile.max_num_batched_tokens,
            max_model_len=self.max_model_len,
            enable_prefix_caching=self.enable_prefix_caching,
        )


@dataclass
class SimState:
    config: VllmSimConfig
    #: one per data-parallel rank (vLLM's "engine" label)
    engines: list[Engine]
    metrics: EngineMetrics
    faults: Faults
    started: float
    started_wall: float
    ids: random.Random
    hanging: set[asyncio.Future[None]] = field(default_factory=set)

    def starting(self) -> bool:
        return time.monotonic() - self.started < self.config.slow_start

    @property
    def engine(self) -> Engine:
        return self.engines[0]

    def pick(self) -> Engine:
        """The least loaded engine core (vLLM's DP balancing: 4 x waiting + running)."""
        return min(
            self.engines, key=lambda e: 4 * e.scheduler.num_waiting + e.scheduler.num_running
        )

    def state(self) -> dict[str, object]:
        """Load over all engine cores: sums of counts, means of KV use and busy time."""
        per = [e.state() for e in self.engines]
        n = len(per)
        total = {
            k: sum(p[k] for p in per)  # type: ignore[misc]
            for k in (
                "running",
                "waiting",
                "queued_prefill_tokens",
                "preemptions",
                "generation_tokens",
                "num_gpu_blocks",
                "steps",
            )
        }
        return {
            **per[0],
            **total,
            "sim_time": per[0]["sim_time"],
            "busy_seconds": sum(p["busy_seconds"] for p in per) / n,
            "kv_cache_usage": sum(p["kv_cache_usage"] for p in per) / n,
            "data_parallel_size": n,
            "engines": per,
        }


CONFIG = web.AppKey("config", VllmSimConfig)
STATE = web.AppKey("state", SimState)


async def _engine_ctx(app: web.Application) -> AsyncIterator[None]:
    cfg = app[CONFIG]
    sched_cfg = cfg.scheduler_config()
    profile = get_profile(cfg.speed_profile)
    metrics = EngineMetrics(
        model_name=cfg.served[0],
        max_model_len=cfg.max_model_len,
        cache_info={
            "block_size": str(sched_cfg.block_size),
            "cache_dtype": "auto",
            "enable_prefix_caching": str(sched_cfg.enable_prefix_caching),
            "gpu_memory_utilization": "0.9",
            "num_cpu_blocks": "None",
            "num_gpu_blocks": str(sched_cfg.num_gpu_blocks),
            "kv_cache_size_tokens": str(sched_cfg.kv_capacity_tokens),
            "prefix_caching_hash_algo": "sha256",
        },
        pod=cfg.pod_name,
        profile=profile.name,
        legacy=cfg.legacy_metrics,
        min_render_interval=cfg.metrics_min_interval,
    )
    engines = [
        Engine(Scheduler(sched_cfg, profile), metrics.engine(str(i)), time_scale=cfg.time_scale)
        for i in range(cfg.data_parallel_size)
    ]
    rng = random.Random(cfg.seed)
    app[STATE] = SimState(
        config=cfg,
        engines=engines,
        metrics=metrics,
        faults=Faults(
            random.Random(rng.random()), {"error": cfg.error_rate, "hang": cfg.hang_rate}
        ),
        started=time.monotonic(),
        started_wall=time.time(),
        ids=random.Random(rng.random()),
    )
    tasks = [asyncio.create_task(e.run(), name=f"engine-loop-{i}") for i, e in enumerate(engines)]
    log.info(
        "engine_started",
        model=cfg.served[0],
        profile=profile.name,
        kv_blocks=sched_cfg.num_gpu_blocks,
        time_scale=cfg.time_scale,
        pod=cfg.pod_name,
        data_parallel_size=cfg.data_parallel_size,
    )
    yield
    for fut in list(app[STATE].hanging):
        fut.cancel()
    for task in tasks:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def make_app(config: VllmSimConfig) -> web.Application:
    get_profile(config.speed_profile)  # fail early on a bad name
    if config.data_parallel_size < 1:
        raise ValueError("data_parallel_size must be at least 1")
    config.scheduler_config()
    app = web.Application()
    app[CONFIG] = config
    app.cleanup_ctx.append(_engine_ctx)
    app.router.add_post("/v1/chat/completions", _chat)
    app.router.add_post("/v1/completions", _completions)
    app.router.add_get("/v1/models", _models)
    app.router.add_post("/tokenize", _tokenize)
    app.router.add_get("/health", _health)
    app.router.add_get("/version", _version)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/sim/state", _sim_state)
    return app


# ---------------------------------------------------------------- handlers


async def _chat(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=True)


async def _completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=False)


async def _generate(request: web.Request, *, chat: bool) -> web.StreamResponse:
    st = request.app[STATE]
    cfg = st.config
    if st.starting():
        return error_response(503, "the engine is starting", "ServiceUnavailableError")
    try:
        p = openai_api.parse(await request.read(), chat=chat)
        model = p.model or cfg.served[0]
        if model not in cfg.served:
            raise ApiError(404, f"The model `{model}` does not exist.", "NotFoundError")
        prompt_tokens = p.prompt_tokens
        limit = cfg.max_model_len
        if prompt_tokens >= limit:
            raise ApiError(
                400,
                f"This model's maximum context length is {limit} tokens. However, "
                f"your request has {prompt_tokens} input tokens. Please reduce the "
                "length of the input messages.",
            )
        if p.max_tokens is not None and prompt_tokens + p.max_tokens > limit:
            raise ApiError(
                400,
                f"This model's maximum context length is {limit} tokens. However, "
                f"you requested {prompt_tokens + p.max_tokens} tokens "
                f"({prompt_tokens} in the messages, {p.max_tokens} in the "
                "completion). Please reduce the length of the messages or completion.",
            )
    except ApiError as exc:
        return exc.response()

    fault = st.faults.draw()
    if fault == "error":
        log.info("injected_error", model=model)
        return error_response(500, "simulated engine failure", "InternalServerError")
    if fault == "hang":
        log.info("injected_hang", model=model)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        st.hanging.add(fut)
        try:
            await fut
        finally:
            st.hanging.discard(fut)
        return web.Response(status=503)

    cap = p.max_tokens if p.max_tokens is not None else limit - prompt_tokens
    rng = tokens.prompt_rng(cfg.seed, p.prompt)
    natural = max(tokens.natural_output_len(rng, cfg.output_len_mean), p.min_tokens, 1)
    output_len, reason = (cap, "length") if p.ignore_eos or natural >= cap else (natural, "stop")
    hashes = () if p.prompt_token_ids is not None else tokens.block_hashes(p.prompt, cfg.block_size)
    rid = f"{'chatcmpl' if chat else 'cmpl'}-{st.ids.getrandbits(64):016x}"
    engine = st.pick()
    stream = engine.submit(rid, prompt_tokens, hashes, output_len, reason)
    words = tokens.token_texts(rng)

    async def token_stream() -> AsyncIterator[tuple[str, str | None]]:
        async for ev in stream.events():
            yield next(words), ev.finish_reason

    try:
        return await openai_api.respond(
            request,
            p,
            response_id=rid,
            model=model,
            prompt_tokens=prompt_tokens,
            stream=token_stream(),
            cached_tokens=(lambda: stream.cached_tokens) if cfg.prompt_tokens_details else None,
            fingerprint=cfg.system_fingerprint or None,
        )
    finally:
        if not stream.done:
            engine.abort(rid)
            log.info("request_aborted", request_id=rid)


async def _tokenize(request: web.Request) -> web.Response:
    """vLLM's ``/tokenize``: the prompt's token ids as the simulator counts them
    (routers such as vllm-router's ``cache_aware`` match prefixes on these)."""
    cfg = request.app[CONFIG]
    try:
        model, text = openai_api.parse_tokenize(await request.read())
        if model is not None and model not in cfg.served:
            raise ApiError(404, f"The model `{model}` does not exist.", "NotFoundError")
    except ApiError as exc:
        return exc.response()
    ids = tokens.token_ids(text)
    return web.json_response({"count": len(ids), "max_model_len": cfg.max_model_len, "tokens": ids,
                              "token_strs": None})


async def _models(request: web.Request) -> web.Response:
    cfg = request.app[CONFIG]
    created = int(request.app[STATE].started_wall)
    data = [
        {
            "id": name,
            "object": "model",
            "created": created,
            "owned_by": "vllm",
            "root": cfg.model,
            "parent": None,
            "max_model_len": cfg.max_model_len,
            "permission": [],
        }
        for name in cfg.served
    ]
    return web.json_response({"object": "list", "data": data})


async def _health(request: web.Request) -> web.Response:
    if request.app[STATE].starting():
        return web.Response(status=503, text="starting")
    return web.Response(status=200)


async def _version(request: web.Request) -> web.Response:
    return web.json_response({"version": VLLM_VERSION})


async def _metrics(request: web.Request) -> web.Response:
    body = request.app[STATE].metrics.render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


async def _sim_state(request: web.Request) -> web.Response:
    st = request.app[STATE]
    cfg = st.config
    profile = get_profile(cfg.speed_profile)
    body = {
        **st.state(),
        "model": cfg.served[0],
        "pod": cfg.pod_name,
        "profile": profile.name,
        "gpu_model": profile.gpu_model,
        "fb_total_mib": profile.fb_total_mib,
        "starting": st.starting(),
    }
    return web.json_response(body)


# --------------------------------------------------------------------- CLI


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m kinference_simulators.vllm",
        description="A vLLM-compatible engine simulator (OpenAI API, /metrics, scheduler model).",
    )
    d = VllmSimConfig()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000, help="0 picks a free port (logged)")
    ap.add_argument("--model", default=d.model)
    ap.add_argument(
        "--served-model-name",
        nargs="+",
        default=[],
        help="names clients use (default: --model); the first labels /metrics",
    )
    ap.add_argument("--max-model-len", type=int, default=d.max_model_len)
    ap.add_argument(
        "--kv-blocks",
        type=int,
        default=None,
        help="KV-cache blocks on the GPU (default: the speed profile's)",
    )
    ap.add_argument("--block-size", type=int, default=d.block_size)
    ap.add_argument("--max-num-seqs", type=int, default=None)
    ap.add_argument("--max-num-batched-tokens", type=int, default=None)
    ap.add_argument("--no-enable-prefix-caching", action="store_true")
    ap.add_argument(
        "--data-parallel-size",
        type=int,
        default=1,
        help="engine cores behind this server, each with its own scheduler and KV cache",
    )
    ap.add_argument("--speed-profile", default=d.speed_profile, help="h100, a10g or fast")
    ap.add_argument(
        "--time-scale",
        type=float,
        default=d.time_scale,
        help="simulated seconds per real second (accelerated time)",
    )
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument(
        "--output-len-mean",
        type=float,
        default=d.output_len_mean,
        help="mean natural output length in tokens",
    )
    ap.add_argument("--error-rate", type=float, default=0.0, help="fraction answered with 500")
    ap.add_argument("--hang-rate", type=float, default=0.0, help="fraction never answered")
    ap.add_argument(
        "--slow-start",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="real seconds after start during which /health and requests get 503",
    )
    ap.add_argument("--pod-name", default="", help="reported in /sim/state and kinference_sim_info")
    ap.add_argument(
        "--legacy-metrics", action="store_true", help="also expose vLLM's deprecated metric names"
    )
    ap.add_argument(
        "--enable-prompt-tokens-details",
        action="store_true",
        help="report usage.prompt_tokens_details.cached_tokens (the prompt tokens found cached)",
    )
    ap.add_argument(
        "--system-fingerprint",
        default="",
        metavar="TEXT",
        help="the system_fingerprint of every answer (e.g. the pod's name; default: none)",
    )
    ap.add_argument(
        "--metrics-min-interval",
        type=float,
        default=d.metrics_min_interval,
        metavar="SECONDS",
        help="re-render /metrics at most this often while busy (0: every scrape)",
    )
    cli.add_logging_arguments(ap)
    return ap.parse_args(argv)


def config_from_args(a: argparse.Namespace) -> VllmSimConfig:
    return VllmSimConfig(
        model=a.model,
        served_model_names=tuple(a.served_model_name),
        max_model_len=a.max_model_len,
        kv_blocks=a.kv_blocks,
        block_size=a.block_size,
        max_num_seqs=a.max_num_seqs,
        max_num_batched_tokens=a.max_num_batched_tokens,
        enable_prefix_caching=not a.no_enable_prefix_caching,
        speed_profile=a.speed_profile,
        time_scale=a.time_scale,
        seed=a.seed,
        output_len_mean=a.output_len_mean,
        error_rate=a.error_rate,
        hang_rate=a.hang_rate,
        slow_start=a.slow_start,
        pod_name=a.pod_name,
        data_parallel_size=a.data_parallel_size,
        legacy_metrics=a.legacy_metrics,
        prompt_tokens_details=a.enable_prompt_tokens_details,
        system_fingerprint=a.system_fingerprint,
        metrics_min_interval=a.metrics_min_interval,
    )


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    try:
        config = config_from_args(a)
        make_app(config)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    cli.run(lambda: make_app(config), a, "vllm")


if __name__ == "__main__":
    main()
