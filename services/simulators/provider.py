"""Off-cluster provider simulator: ``python -m kinference_simulators.provider --help``.

An OpenAI-compatible ``/v1/chat/completions`` and ``/v1/completions``
(streaming and not) standing in for OpenAI or Databricks: ``Authorization:
Bearer KEY`` checking (401), served models (404 otherwise), a TTFT drawn
from a normal distribution (``--ttft-ms``, ``--ttft-jitter-ms``, never
below 0), ``--tokens-per-second`` after the first token, and injected
faults: 429 with ``Retry-After`` (``--rate-429``, ``--retry-after``), 500
(``--rate-5xx``), and requests never answered (``--timeout-rate``).

It keeps its own record of what it received, so tests can prove what did
(or did not) leave the cluster: ``GET /sim/requests`` returns the last
``--keep`` requests as ``{model, stream, authorized, prompt_sha256,
prompt_text, path, status, time, body}`` (oldest first; ``?limit=N`` for the
last N). ``prompt_text`` is the messages' text joined by newlines (the
prompt of a completion); ``body`` is the raw request body, so a test can
look for a secret anywhere in what arrived. Unauthorized and malformed
requests are recorded too. ``DELETE /sim/requests`` clears the record;
``--log-file`` appends the same records as JSON lines.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import random
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import msgspec
from aiohttp import web

from . import cli, openai_api, tokens
from .faults import Faults
from .openai_api import ApiError, error_response

log = cli.log


@dataclass(frozen=True)
class ProviderSimConfig:
    api_keys: tuple[str, ...] = ("sk-sim",)
    models: tuple[str, ...] = ("gpt-4o-mini",)
    ttft_ms: float = 300.0
    ttft_jitter_ms: float = 50.0
    tokens_per_second: float = 80.0
    rate_429: float = 0.0
    retry_after: float = 1.0
    rate_5xx: float = 0.0
    timeout_rate: float = 0.0
    output_len_mean: float = 64.0
    seed: int = 0
    keep: int = 1000
    log_file: str | None = None


class Record(msgspec.Struct):
    model: str | None
    stream: bool
    authorized: bool
    prompt_sha256: str
    prompt_text: str
    path: str
    status: int
    time: float
    #: the whole request body as received (a prompt may hide in any field)
    body: str
    #: the request's headers as received (the API key's value is masked)
    headers: dict[str, str] = {}


@dataclass
class ProviderState:
    config: ProviderSimConfig
    faults: Faults
    latency: random.Random
    ids: random.Random
    records: deque[Record]
    log_file: IO[bytes] | None = None
    hanging: set[asyncio.Future[None]] = field(default_factory=set)

    def record(self, rec: Record) -> None:
        self.records.append(rec)
        if self.log_file is not None:
            self.log_file.write(msgspec.json.encode(rec) + b"\n")
            self.log_file.flush()


CONFIG = web.AppKey("config", ProviderSimConfig)
STATE = web.AppKey("state", ProviderState)


async def _state_ctx(app: web.Application) -> AsyncIterator[None]:
    cfg = app[CONFIG]
    rng = random.Random(cfg.seed)
    st = ProviderState(
        config=cfg,
        faults=Faults(
            random.Random(rng.random()),
            {
                "429": cfg.rate_429,
                "5xx": cfg.rate_5xx,
                "timeout": cfg.timeout_rate,
            },
        ),
        latency=random.Random(rng.random()),
        ids=random.Random(rng.random()),
        records=deque(maxlen=cfg.keep),
    )
    if cfg.log_file:
        Path(cfg.log_file).parent.mkdir(parents=True, exist_ok=True)
        st.log_file = await asyncio.to_thread(open, cfg.log_file, "ab")  # closed below
    app[STATE] = st
    try:
        yield
    finally:
        for fut in list(st.hanging):
            fut.cancel()
        if st.log_file is not None:
            st.log_file.close()


def make_app(config: ProviderSimConfig) -> web.Application:
    if not config.api_keys:
        raise ValueError("at least one --api-key is required")
    if not config.models:
        raise ValueError("at least one --model is required")
    Faults(
        random.Random(0),
        {"429": config.rate_429, "5xx": config.rate_5xx, "timeout": config.timeout_rate},
    )  # validate rates
    app = web.Application()
    app[CONFIG] = config
    app.cleanup_ctx.append(_state_ctx)
    app.router.add_post("/v1/chat/completions", _chat)
    app.router.add_post("/v1/completions", _completions)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/sim/requests", _get_requests)
    app.router.add_delete("/sim/requests", _clear_requests)
    return app


def _authorized(request: web.Request, keys: tuple[str, ...]) -> bool:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token:
        return False
    return any(hmac.compare_digest(token.strip().encode(), k.encode()) for k in keys)


async def _chat(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=True)


async def _completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=False)


async def _generate(request: web.Request, *, chat: bool) -> web.StreamResponse:
    st = request.app[STATE]
    cfg = st.config
    authorized = _authorized(request, cfg.api_keys)
    body = await request.read()
    body_text = body.decode("utf-8", "replace")

    def record(status: int, p: openai_api.Prompted | None) -> None:
        text = p.text if p is not None else body_text
        st.record(
            Record(
                model=p.model if p is not None else None,
                stream=p.stream if p is not None else False,
                authorized=authorized,
                prompt_sha256=hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest(),
                prompt_text=text,
                path=request.path,
                status=status,
                time=time.time(),
                body=body_text,
                headers={k: ("<masked>" if k.lower() == "authorization" else v)
                         for k, v in request.headers.items()},
            )
        )

    try:
        p = openai_api.parse(body, chat=chat)
    except ApiError as exc:
        # unparseable: recorded with the raw body as its prompt text
        record(exc.status if authorized else 401, None)
        if not authorized:
            return error_response(401, "Incorrect API key provided.", "invalid_request_error")
        return exc.response()

    if not authorized:
        record(401, p)
        return error_response(401, "Incorrect API key provided.", "invalid_request_error")
    if p.model not in cfg.models:
        record(404, p)
        return error_response(
            404,
            f"The model `{p.model}` does not exist or you do not have access to it.",
            "invalid_request_error",
        )
    fault = st.faults.draw()
    if fault == "429":
        record(429, p)
        return error_response(
            429,
            "Rate limit reached for requests.",
            "rate_limit_error",
            {"Retry-After": f"{cfg.retry_after:g}"},
        )
    if fault == "5xx":
        record(500, p)
        return error_response(
            500, "The server had an error while processing your request.", "server_error"
        )
    record(200, p)
    if fault == "timeout":
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        st.hanging.add(fut)
        try:
            await fut
        finally:
            st.hanging.discard(fut)

    ttft = max(0.0, st.latency.gauss(cfg.ttft_ms, cfg.ttft_jitter_ms)) / 1000.0
    rng = tokens.prompt_rng(cfg.seed, p.prompt)
    natural = max(tokens.natural_output_len(rng, cfg.output_len_mean), p.min_tokens, 1)
    cap = p.max_tokens if p.max_tokens is not None else 4096
    n_out, reason = (cap, "length") if p.ignore_eos or natural >= cap else (natural, "stop")
    gap = 1.0 / cfg.tokens_per_second if cfg.tokens_per_second > 0 else 0.0
    words = tokens.token_texts(rng)
    start = asyncio.get_running_loop().time()

    async def stream() -> AsyncIterator[tuple[str, str | None]]:
        loop = asyncio.get_running_loop()
        for i in range(n_out):
            delay = start + ttft + i * gap - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            yield next(words), (reason if i == n_out - 1 else None)

    rid = f"{'chatcmpl' if chat else 'cmpl'}-{st.ids.getrandbits(64):016x}"
    return await openai_api.respond(
        request,
        p,
        response_id=rid,
        model=p.model or cfg.models[0],
        prompt_tokens=p.prompt_tokens,
        stream=stream(),
    )


async def _models(request: web.Request) -> web.Response:
    st = request.app[STATE]
    if not _authorized(request, st.config.api_keys):
        return error_response(401, "Incorrect API key provided.", "invalid_request_error")
    data = [{"id": m, "object": "model", "created": 0, "owned_by": "sim"} for m in st.config.models]
    return web.json_response({"object": "list", "data": data})


async def _get_requests(request: web.Request) -> web.Response:
    """The last requests received, oldest first (``?limit=N``: only the last N)."""
    records = list(request.app[STATE].records)
    limit = request.query.get("limit")
    if limit is not None:
        try:
            n = int(limit)
        except ValueError:
            return error_response(400, "limit must be an integer", "invalid_request_error")
        records = records[-n:] if n > 0 else []
    recs: list[dict[str, Any]] = msgspec.to_builtins(records)
    return web.json_response(recs)


async def _clear_requests(request: web.Request) -> web.Response:
    request.app[STATE].records.clear()
    return web.Response(status=204)


# --------------------------------------------------------------------- CLI


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m kinference_simulators.provider",
        description="An OpenAI-compatible provider simulator (latency, rate limits, faults).",
    )
    d = ProviderSimConfig()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8100, help="0 picks a free port (logged)")
    ap.add_argument(
        "--api-key", action="append", required=True, help="accepted bearer token (repeatable)"
    )
    ap.add_argument("--model", action="append", required=True, help="served model (repeatable)")
    ap.add_argument("--ttft-ms", type=float, default=d.ttft_ms, help="mean time to first token")
    ap.add_argument(
        "--ttft-jitter-ms",
        type=float,
        default=d.ttft_jitter_ms,
        help="standard deviation of the TTFT",
    )
    ap.add_argument("--tokens-per-second", type=float, default=d.tokens_per_second)
    ap.add_argument("--rate-429", type=float, default=0.0, help="fraction answered 429")
    ap.add_argument(
        "--retry-after", type=float, default=d.retry_after, help="Retry-After seconds on a 429"
    )
    ap.add_argument("--rate-5xx", type=float, default=0.0, help="fraction answered 500")
    ap.add_argument("--timeout-rate", type=float, default=0.0, help="fraction never answered")
    ap.add_argument("--output-len-mean", type=float, default=d.output_len_mean)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", type=int, default=d.keep, help="requests kept for /sim/requests")
    ap.add_argument("--log-file", default=None, help="append received requests as JSON lines")
    cli.add_logging_arguments(ap)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    config = ProviderSimConfig(
        api_keys=tuple(a.api_key),
        models=tuple(a.model),
        ttft_ms=a.ttft_ms,
        ttft_jitter_ms=a.ttft_jitter_ms,
        tokens_per_second=a.tokens_per_second,
        rate_429=a.rate_429,
        retry_after=a.retry_after,
        rate_5xx=a.rate_5xx,
        timeout_rate=a.timeout_rate,
        output_len_mean=a.output_len_mean,
        seed=a.seed,
        keep=a.keep,
        log_file=a.log_file,
    )
    try:
        make_app(config)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    cli.run(lambda: make_app(config), a, "provider")


if __name__ == "__main__":
    main()
