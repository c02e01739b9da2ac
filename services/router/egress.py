"""The provider egress: how a Provider decision of the Endpoint Picker is carried out.

A gateway can only send a request to an address; a provider needs its API
key, which only the router holds. So for a Provider pick the Endpoint Picker
names a router replica's egress listener (``--egress-port``) as the
destination and adds request header ``x-kinference-egress``: a token, an
HMAC-SHA256 (key shared by the replicas) over the decision id, the pool, the
provider, the served model, the egress address, the SHA-256 of the exact
body the egress will receive, the rule, and an expiry (60 s). The egress
forwards a request only with a valid, unexpired, unused token whose body
hash matches, to that provider alone, with the provider's key, through the
router's own provider send path (``Router._send``: limiter, ledger, metrics,
observation). The body is the one the send path would build, but without
its request for a stream's usage (``provider_request.body(..., usage=False)``):
the send path adds that request, and reads the client's own wish from the
body the token covers, so the client gets the usage event only when it
asked for it, as on the data port. Anything else is 403
``egress_forbidden`` and nothing is sent: the listener is not an open
proxy, and a client cannot forge or replay a token, change the prompt it
covers, or pick another provider.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from kinference_common.engine import Decision, Request, Snapshot
from kinference_common.engine.signals import DecisionContext
from kinference_common.engine.tokens import estimate_prompt_tokens
from kinference_router.director import ApiError

TOKEN_HEADER = "x-kinference-egress"
#: how long a token is good for, seconds
TOKEN_TTL = 60.0
_KEY_CONTEXT = b"kinference-egress-key-v1"


def derive_key(secret: str | bytes | None) -> bytes:
    """The token key every replica derives alike from the router's NATS
    password (as replica_sync.hash_key does, in its own context); None (no
    NATS authentication): a fixed key, which is no secret: use
    ``--egress-key-file`` then."""
    raw = secret.encode() if isinstance(secret, str) else (secret or b"")
    return hashlib.blake2b(raw, key=_KEY_CONTEXT, digest_size=32).digest()


def key_from_file(path: Path) -> bytes:
    """``--egress-key-file``: its bytes (stripped), hashed to 32 bytes; ValueError when empty."""
    data = path.read_bytes().strip()
    if not data:
        raise ValueError(f"--egress-key-file {path} is empty")
    return hashlib.blake2b(data, key=_KEY_CONTEXT, digest_size=32).digest()


class Claims(msgspec.Struct, forbid_unknown_fields=True):
    i: str  #: decision id
    p: str  #: ns/pool
    v: str  #: provider ns/name
    m: str  #: served (upstream) model
    a: str  #: the egress address the token is for
    h: str  #: SHA-256 hex of the body
    r: str  #: rule
    e: float  #: expiry, unix seconds


class _Unsent(ApiError):
    """A refusal before anything reached the provider (a retry may have it again)."""


class Forbidden(Exception):
    """Why the egress refuses a request (a metric label; never the body);
    ``claims``: the token's, when it was valid but used already."""

    def __init__(self, reason: str, message: str, claims: Claims | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.claims = claims


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


_claims_decoder = msgspec.json.Decoder(Claims)


@dataclass
class EgressTokens:
    key: bytes
    ttl: float = TOKEN_TTL
    #: decision id -> expiry of tokens already used (pruned as they expire)
    used: dict[str, float] = field(default_factory=dict)

    def mint(self, *, decision_id: str, pool: str, provider: str, model: str, address: str, body: bytes,
             rule: str, now: float | None = None) -> str:
        claims = Claims(i=decision_id, p=pool, v=provider, m=model, a=address, h=hashlib.sha256(body).hexdigest(),
                        r=rule, e=(now if now is not None else time.time()) + self.ttl)
        payload = _b64(msgspec.json.encode(claims))
        return payload + "." + _b64(hmac.new(self.key, payload.encode(), hashlib.sha256).digest())

    def check(self, token: str | None, *, pool: str, address: str, body: bytes, now: float | None = None) -> Claims:
        """The token's claims, once: Forbidden when missing, forged, expired,
        used, for another pool or egress, or for another body."""
        now = now if now is not None else time.time()
        if not token:
            raise Forbidden("missing", f"no {TOKEN_HEADER} header: the egress forwards only requests the "
                            "Endpoint Picker sent")
        payload, _, mac = token.partition(".")
        try:
            good = hmac.compare_digest(_unb64(mac), hmac.new(self.key, payload.encode(), hashlib.sha256).digest())
            claims = _claims_decoder.decode(_unb64(payload)) if good else None
        except (ValueError, msgspec.DecodeError):
            claims = None
        if claims is None:
            raise Forbidden("invalid", f"{TOKEN_HEADER} is not a token of this pool's Endpoint Picker")
        if claims.e < now:
            raise Forbidden("expired", f"{TOKEN_HEADER} has expired")
        if claims.p != pool or claims.a != address:
            raise Forbidden("wrong_target", f"{TOKEN_HEADER} is for another pool or egress")
        if not hmac.compare_digest(claims.h, hashlib.sha256(body).hexdigest()):
            raise Forbidden("body_changed", "the body is not the one the Endpoint Picker decided on")
        for k in [k for k, e in self.used.items() if e < now]:
            del self.used[k]
        if claims.i in self.used:
            raise Forbidden("reused", f"{TOKEN_HEADER} was used already", claims)
        self.used[claims.i] = claims.e
        return claims


def provider_decision(snap: Snapshot, claims: Claims, prompt_texts: list[str]) -> Decision | None:
    """The Provider decision a token carries, on the egress's snapshot (None
    when the pool no longer has that provider serving that model): what the
    router's provider send path needs (candidate, rule, request size)."""
    cand = next((c for c in snap.by_key.get(claims.v, ()) if not c.is_local and c.served_name == claims.m), None)
    if cand is None:
        return None
    d = Decision()
    d.routed, d.candidate, d.rule, d.canonical_model = True, cand, claims.r, cand.model
    tokens = estimate_prompt_tokens(prompt_texts)
    d.request = Request(model=cand.model, tenant="egress", prompt_tokens=tokens)
    d.snapshot = snap
    d.context = DecisionContext({}, tokens, (), None, snap.ttft_model)
    return d


class Egress:
    """The egress listener's handlers (``--egress-port``): POST
    /v1/chat/completions and /v1/completions, each forwarded with the
    router's provider send path when its token holds (see the module
    docstring), else 403 ``egress_forbidden``."""

    def __init__(self, router: Any, tokens: EgressTokens, address: str) -> None:
        self.router, self.tokens, self.address = router, tokens, address
        self.refused = router.metrics.egress_refused
        #: decision id -> (expiry, the refusal) of tokens whose request was refused before anything
        #: reached the provider: the gateway's retry of such an answer (Envoy retries a 503) gets the
        #: same refusal, not "used already" (nothing was sent, so nothing can be sent twice)
        self.unsent: dict[str, tuple[float, Any]] = {}

    def server(self) -> Any:
        from kinference_router.app import server_error
        from kinference_router.http_server import HttpServer

        async def chat(request: Any) -> Any:
            return await self.handle(request, chat=True)

        async def completions(request: Any) -> Any:
            return await self.handle(request, chat=False)

        s = self.router.settings
        return HttpServer({"/v1/chat/completions": {"POST": chat}, "/v1/completions": {"POST": completions}},
                          max_body_bytes=s.max_body_bytes, limits=s.http, on_error=server_error)

    async def handle(self, request: Any, *, chat: bool) -> Any:
        from kinference_router.app import _NOT_SENT, error_response, new_decision_id

        router = self.router
        dr = router.director
        try:
            if request.body_too_large:
                raise Forbidden("too_large", "body over the router's --max-body-bytes")
            claims = self.tokens.check(request.headers.get(TOKEN_HEADER), pool=dr.pool_label,
                                       address=self.address, body=request.body)
        except Forbidden as exc:
            again = self.unsent.get(exc.claims.i) if exc.claims is not None else None
            if again is not None:  # the gateway retried a refusal: the same refusal, counted once
                return error_response(again[1], exc.claims.i)  # type: ignore[union-attr]
            self.refused.labels(exc.reason).inc()
            dr.count("", "egress_forbidden", "Provider")  # an answered request, as every other the egress answers
            return error_response(ApiError(403, "egress_forbidden", f"egress refused the request: {exc}"),
                                  new_decision_id())
        decision_id = claims.i
        try:
            body = dr.read(request.body, False, chat)
            snap = dr.keeper.snapshot
            d = provider_decision(snap, claims, body.texts) if snap is not None else None
            if d is None:
                raise _Unsent(503, "no_capacity", f"the pool no longer has provider {claims.v} serving "
                              f"{claims.m!r}", retry_after=1)
            result = await router._send(request, chat, body, d.request, d, snap, decision_id)
            if result is _NOT_SENT:
                raise _Unsent(502, "upstream_error", f"provider {claims.v} refused the connection")
            return result
        except (asyncio.CancelledError, ConnectionResetError):  # the client went away (counted here, as
            dr.count(claims.r, "abandoned", "")  # the data port counts it; the picker leaves it to the egress)
            raise
        except ApiError as err:
            dr.count(err.rule or claims.r, err.code, "Provider")
            if isinstance(err, _Unsent):
                now = time.time()
                for k in [k for k, (e, _) in self.unsent.items() if e < now]:
                    del self.unsent[k]
                self.unsent[decision_id] = (claims.e, err)
            return error_response(err, decision_id)
