"""The Endpoint Picker: the router's second front door, Envoy's ext_proc gRPC service.

A gateway that implements the Gateway API Inference Extension calls
``envoy.service.ext_proc.v3.ExternalProcessor/Process`` once per request
(modes: headers SEND, bodies FULL_DUPLEX_STREAMED, trailers SEND) and sends
the request where the answer says. One stream, in order (:class:`PickStream`):

1. request headers: a completion's (a POST to one of :data:`COMPLETIONS`)
   kept, not answered yet; any other request answered at once as the data
   port answers it (``GET /v1/models`` from the snapshot, a path or method
   it does not serve 404 or 405);
2. request body chunks: gathered; at its end the request goes through the
   router's own decision path (:mod:`kinference_router.director`: tenant,
   body, classification, decision with flow control, decision event), then
   the answers go out in order: the headers response (``clear_route_cache``,
   ``x-gateway-destination-endpoint`` as header and as ``envoy.lb`` dynamic
   metadata, ``Content-Length``), the body (rewritten when the model name
   changes) in chunks of at most 62,000 bytes, the trailers response; an
   answer of the router's own (400, 401, 404, 413, 429, 503, ...) is an
   ImmediateResponse in the router's error envelope;
3. response headers and body: the endpoint that served (``envoy.lb`` /
   ``x-gateway-destination-endpoint-served``) takes the in-flight accounting,
   the first body chunk is the time to first token, usage is read as the
   router reads it, the client's model name is put back
   (:mod:`kinference_router.model_name`); a pod's error status is answered
   as the data port answers it (``validate.upstream_refusal``: the router's
   envelope, an ImmediateResponse);
4. the end of the response, or of the stream however it ends, finishes the
   send in the in-flight ledger.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Any

import grpc
import msgspec
import structlog
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from envoy.type.v3 import http_status_pb2
from google.protobuf import struct_pb2
from grpc_health.v1 import _async as health_async
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kinference_common.engine import Decision, Snapshot
from kinference_common.tasks import cancel_and_wait
from kinference_router import http_server, models_api, provider_request, retry, validate
from kinference_router.app import ApiError, Router, error_response, new_decision_id
from kinference_router.director import Director, Send
from kinference_router.egress import TOKEN_HEADER, EgressTokens
from kinference_router.model_name import Restorer

log = structlog.get_logger("epp")

#: the largest body chunk of a streamed_response (what Envoy accepts in one message)
BODY_CHUNK = 62_000
DESTINATION = "x-gateway-destination-endpoint"
SERVED = "x-gateway-destination-endpoint-served"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"
LB_NAMESPACE = "envoy.lb"
#: conformance test hooks (behind --epp-conformance-hooks)
HOOK_SELECTION = "test-epp-endpoint-selection"
HOOK_ECHO = "x-echo-set-header"
HOOK_SERVED = "x-conformance-test-served-endpoint"
#: a non-streamed response body is held (to restore the model name) up to this size
MAX_HELD_RESPONSE = 16 * 1024 * 1024
#: the health services
EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
#: the paths whose POST goes through the decision path (the others are answered at once)
COMPLETIONS = ("/v1/chat/completions", "/v1/completions")
#: client request headers never passed to a pod (as the router's own proxy drops them)
_REMOVE_LOCAL = ("authorization", "x-kinference-tenant", TOKEN_HEADER)
_OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD


@dataclass
class EppSettings:
    #: honour GIE's conformance test hooks
    conformance_hooks: bool = False
    #: endpoints after the pick in the destination list (retries walk it), at most; 0 by default:
    #: Envoy's ORIGINAL_DST cluster takes one ip:port only (a list needs override_host)
    fallbacks: int = 0
    #: the egress's ``ip:port`` (what a Provider pick names); None: no egress, a Provider pick is a 503
    egress_address: str | None = None
    #: the egress tokens' key (with ``egress_address``)
    egress: EgressTokens | None = None


def _header(key: str, value: str) -> base_pb2.HeaderValueOption:
    return base_pb2.HeaderValueOption(header=base_pb2.HeaderValue(key=key, raw_value=value.encode()),
                                      append_action=_OVERWRITE)


def _headers_of(msg: pb.HttpHeaders) -> dict[str, str]:
    out: dict[str, str] = {}
    for h in msg.headers.headers:
        out[h.key.lower()] = h.raw_value.decode("utf-8", "replace") if h.raw_value else h.value
    return out


def _struct(fields: dict[str, dict[str, str]]) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    for ns, values in fields.items():
        s.fields[ns].struct_value.update(values)
    return s


def _metadata_value(msg: pb.ProcessingRequest, namespace: str, key: str) -> list[str] | None:
    """A filter-metadata value as a list of strings (a list, or a comma
    string); None when absent."""
    if not msg.HasField("metadata_context"):
        return None
    ns = msg.metadata_context.filter_metadata.get(namespace)
    if ns is None or key not in ns.fields:
        return None
    v = ns.fields[key]
    kind = v.WhichOneof("kind")
    if kind == "list_value":
        return [x.string_value.strip() for x in v.list_value.values if x.string_value.strip()]
    if kind == "string_value":
        return [x.strip() for x in v.string_value.split(",") if x.strip()]
    return []


def immediate(status: int, body: bytes, headers: Iterable[tuple[str, str]] = (),
              content_type: str = "application/json") -> pb.ProcessingResponse:
    return pb.ProcessingResponse(immediate_response=pb.ImmediateResponse(
        status=http_status_pb2.HttpStatus(code=status),
        headers=pb.HeaderMutation(set_headers=[_header("content-type", content_type),
                                               *(_header(k.lower(), v) for k, v in headers)]),
        body=body, details=f"kinference_{status}"))


def _error(err: ApiError, decision_id: str) -> pb.ProcessingResponse:
    r = error_response(err, decision_id)
    return immediate(r.status, r.body, r.headers)


def body_chunks(data: bytes, *, end: bool = True, size: int = BODY_CHUNK) -> list[bytes]:
    """``data`` in chunks of at most ``size`` bytes (one empty chunk for no data)."""
    return [data[i:i + size] for i in range(0, len(data), size)] or [b""]


def _streamed(data: bytes, *, request: bool, end: bool) -> list[pb.ProcessingResponse]:
    chunks = body_chunks(data)
    out = []
    for n, chunk in enumerate(chunks):
        body = pb.BodyResponse(response=pb.CommonResponse(body_mutation=pb.BodyMutation(
            streamed_response=pb.StreamedBodyResponse(body=chunk, end_of_stream=end and n == len(chunks) - 1))))
        out.append(pb.ProcessingResponse(request_body=body) if request else pb.ProcessingResponse(response_body=body))
    return out


def _matches(address: str, allowed: list[str]) -> bool:
    """``ip:port`` in ``allowed``, or its IP alone (a bare IP matches every port)."""
    ip = address.rsplit(":", 1)[0]
    return any(a == address or a == ip for a in allowed)


class PickStream:
    """One ext_proc stream: one HTTP request through the gateway."""

    def __init__(self, picker: Picker) -> None:
        self.picker = picker
        self.router = picker.router
        self.director: Director = picker.router.director
        self.headers: dict[str, str] = {}
        self.body = bytearray()
        self.too_large = False
        self.subset: list[str] | None = None
        self.decided = False
        self.trailers = False
        self.decision_id = ""
        self.decision: Decision | None = None
        self.traces: list[Any] = []
        self.snapshot: Snapshot | None = None
        self.send: Send | None = None
        self.pick = ""
        #: puts the client's model name back in the response (None: the pick serves that name)
        self.restore: Restorer | None = None
        #: a Local pick: a pod's error status is answered in the router's envelope (the egress does so itself)
        self.local = False
        #: the response is a pod's error status, held to be answered as the data port answers it
        self.refused = False
        #: the endpoint the gateway reports it sent the request to (envoy.lb metadata); None: not reported
        self.served: str | None = None
        self.resp_retry_after: str | None = None
        self.resp_status = 0
        self.resp_streaming = False
        self.resp_first = True
        self.resp_held: bytearray | None = None
        self.resp_headers: list[base_pb2.HeaderValueOption] = []
        self.resp_tail = b""
        self.resp_len = 0
        self.finished = False
        #: an ImmediateResponse went out: the stream is over
        self.closed = False

    # ------------------------------------------------------------ request

    async def on(self, msg: pb.ProcessingRequest) -> list[pb.ProcessingResponse]:
        kind = msg.WhichOneof("request")
        if kind == "request_headers":
            self.headers = _headers_of(msg.request_headers)
            self.subset = _metadata_value(msg, SUBSET_NAMESPACE, SUBSET_KEY)
            if not self._completion():
                return [self._at_once()]
            if msg.request_headers.end_of_stream:  # no body: refused as the data port refuses an empty one
                return await self._decide()
            return []  # answered once the body has ended
        if kind == "request_body":
            if self.subset is None:
                self.subset = _metadata_value(msg, SUBSET_NAMESPACE, SUBSET_KEY)
            chunk = msg.request_body.body
            if len(self.body) + len(chunk) > self.director.settings.max_body_bytes:
                self.too_large = True
                self.body.clear()
            elif not self.too_large:
                self.body += chunk
            if msg.request_body.end_of_stream and not self.decided:
                return await self._decide()
            return []
        if kind == "request_trailers":
            self.trailers = True
            out = [] if self.decided else await self._decide()
            if not self.closed:
                out.append(pb.ProcessingResponse(request_trailers=pb.TrailersResponse()))
            return out
        if kind == "response_headers":
            return self._response_headers(msg)
        if kind == "response_body":
            return self._response_body(msg.response_body.body, msg.response_body.end_of_stream)
        if kind == "response_trailers":
            out = self._response_body(b"", True) if not self.finished else []
            if not self.closed:
                out.append(pb.ProcessingResponse(response_trailers=pb.TrailersResponse()))
            return out
        return []

    def _close(self, resp: pb.ProcessingResponse) -> list[pb.ProcessingResponse]:
        self.closed = True
        return [resp]

    def _path(self) -> str:
        return self.headers.get(":path", "").split("?", 1)[0]

    def _completion(self) -> bool:
        """A POST to a completion path: what goes through the decision path."""
        return self.headers.get(":method") == "POST" and self._path() in COMPLETIONS

    def _at_once(self) -> pb.ProcessingResponse:
        """Any request but a completion, answered at once, as the router's
        data port answers it: a path or method it does not serve (404, 405
        with ``Allow``: ``http_server.refusal``), GET /v1/models (from the
        snapshot, with a valid API key; a body, if any, is not read)."""
        self.closed = True
        path, method = self._path(), self.headers.get(":method", "")
        methods = http_server.route_methods(self.picker.routes, path)
        if methods is None or http_server.handler_for(methods, method) is None:
            status, code, message, headers = http_server.refusal(path or "(none)", method, methods)
            err = ApiError(status, code, message)
            err.headers = headers
            return _error(err, new_decision_id())
        try:  # the model list is the API's too: a key first, as on the data port
            self.director.authenticate(self.headers)
        except ApiError as err:
            self.director.count("", err.code, "")
            return _error(err, new_decision_id())
        snap = self.director.keeper.snapshot
        models = snap.pool.models if snap else []
        if path == models_api.PREFIX.rstrip("/"):
            return immediate(200, msgspec.json.encode(models_api.model_list(models)))
        found = models_api.find(models, path)
        if found is not None:
            return immediate(200, msgspec.json.encode(models_api.model_object(found)))
        return _error(ApiError(404, "model_not_found", "no destination of the pool serves "
                               f"{path[len(models_api.PREFIX):]!r}"), new_decision_id())

    def _restriction(self) -> list[str] | None:
        """The endpoints the gateway (subset hint) or a conformance test
        allows, None: every endpoint of the pool."""
        allowed = self.subset
        if self.picker.settings.conformance_hooks and HOOK_SELECTION in self.headers:
            hook = [x.strip() for x in self.headers[HOOK_SELECTION].split(",") if x.strip()]
            allowed = hook if allowed is None else [a for a in allowed if _matches(a, hook) or a in hook]
        return allowed

    async def _decide(self) -> list[pb.ProcessingResponse]:
        self.decided = True
        dr = self.director
        if not self._completion():  # a body without request headers: never a completion
            return [self._at_once()]
        self.decision_id = decision_id = new_decision_id()
        try:
            tags = dr.admit(self.headers, bytes(self.body), self.too_large, self._path() == COMPLETIONS[0],
                            decision_id)
            snap = dr.keeper.snapshot
            assert snap is not None  # admit said 503 otherwise
            avoid: frozenset[str] = frozenset()
            allowed = self._restriction()
            if allowed is not None:
                avoid = frozenset(c.ledger_key for c in snap.candidates
                                  if not c.is_local or not _matches(c.state.address, allowed))  # type: ignore[union-attr]
                if not allowed or all(c.ledger_key in avoid for c in snap.candidates):
                    raise ApiError(503, "no_capacity", "no endpoint of the pool is in the gateway's subset hint"
                                   if self.subset is not None else f"no endpoint of the pool matches {HOOK_SELECTION}",
                                   retry_after=1)
            d = await dr.routing(tags, decision_id, avoid=avoid).next()
            if d is None:
                raise ApiError(503, "no_capacity", "the router lost its configuration", retry_after=1)
            return self._routed(d, tags, avoid)
        except ApiError as err:
            dr.count(err.rule, err.code, "")
            if err.decision is not None and err.amended == "not_sent":  # after the decision's own event
                asyncio.get_running_loop().call_soon(dr.publish_decision, err.decision, decision_id, tags.traces,
                                                     err.amended)
            return self._close(_error(err, decision_id))

    def _fallbacks(self, d: Decision, tags: Any, avoid: frozenset[str]) -> list[str]:
        """The next best endpoints of the same pool on the same snapshot,
        after the pick (Local only: a retry reaches a pod, never the egress)."""
        out: list[str] = []
        n = self.picker.settings.fallbacks
        if n <= 0:
            return out
        snap = d.snapshot
        skip = set(avoid) | {d.candidate.ledger_key}
        req = tags.fail_closed(snap)  # a classifier not asked counts as failed: never looser
        for _ in range(n):
            nd = self.director.decide(req, snap, skip)
            c = nd.candidate
            if not nd.routed or c is None or not c.is_local:
                break
            skip.add(c.ledger_key)
            out.append(c.state.address)  # type: ignore[union-attr]
        return out

    def _routed(self, d: Decision, tags: Any, avoid: frozenset[str]) -> list[pb.ProcessingResponse]:
        settings = self.picker.settings
        cand = d.candidate
        assert cand is not None
        body = tags.body
        set_headers: list[base_pb2.HeaderValueOption] = []
        remove: list[str] = []
        if cand.is_local:
            data = bytes(self.body) if cand.served_name == body.model else body.encode(cand.served_name)
            self.pick = cand.state.address  # type: ignore[union-attr]
            destination = ",".join([self.pick, *self._fallbacks(d, tags, avoid)])
            remove.extend(_REMOVE_LOCAL)
            self.send = self.director.begin(d, d.snapshot, self.decision_id)
        else:
            if settings.egress is None or settings.egress_address is None:
                err = ApiError(503, "no_capacity", f"the decision is {cand.backend}, and this Endpoint Picker "
                               "has no provider egress (--egress-port)", retry_after=1, rule=d.rule or "")
                # routed, then not carried out: the answer names the rule and backend (as the router's),
                # and the decision is published again with what the client was answered
                err.headers = [("x-kinference-rule", d.rule or "unmatched"), ("x-kinference-backend", cand.backend)]
                err.decision, err.amended = retry.answered(d, err.code, err.message), "not_sent"
                raise err
            # the client's stream_options kept: the egress asks for usage and strips what the client did not ask
            data = provider_request.body(body.raw, cand.served_name, usage=False)
            self.pick = destination = settings.egress_address
            token = settings.egress.mint(decision_id=self.decision_id, pool=self.director.pool_label,
                                         provider=cand.ledger_key, model=cand.served_name,
                                         address=settings.egress_address, body=data, rule=d.rule or "unmatched")
            set_headers.append(_header(TOKEN_HEADER, token))
        self.decision, self.snapshot, self.local = d, d.snapshot, cand.is_local
        self.traces = tags.traces  # the classifiers' traces, for a second decision event
        self.restore = Restorer.of(cand.served_name, body.model)
        set_headers += [_header(DESTINATION, destination), _header("content-length", str(len(data))),
                        _header("x-kinference-decision-id", self.decision_id)]
        if settings.conformance_hooks:
            set_headers.append(_header(HOOK_ECHO, f"{HOOK_SERVED}:{self.pick}"))
        self.resp_headers = [_header("x-kinference-decision-id", self.decision_id),
                             _header("x-kinference-rule", d.rule or "unmatched"),
                             _header("x-kinference-backend", cand.backend)]
        headers = pb.ProcessingResponse(
            request_headers=pb.HeadersResponse(response=pb.CommonResponse(
                clear_route_cache=True,
                header_mutation=pb.HeaderMutation(set_headers=set_headers, remove_headers=remove))),
            dynamic_metadata=_struct({LB_NAMESPACE: {DESTINATION: destination}}))
        return [headers, *_streamed(data, request=True, end=not self.trailers)]

    # ----------------------------------------------------------- response

    def _response_headers(self, msg: pb.ProcessingRequest) -> list[pb.ProcessingResponse]:
        h = _headers_of(msg.response_headers)
        try:
            self.resp_status = int(h.get(":status", "200"))
        except ValueError:
            self.resp_status = 0
        if self.send is not None:
            self.send.obs.status = self.resp_status
        self.resp_streaming = h.get("content-type", "").startswith("text/event-stream")
        served = _metadata_value(msg, LB_NAMESPACE, SERVED)
        served_ep = self.served = served[0] if served else None
        if served_ep:
            self.picker.gateway_reports_served = True
        # a pod's error status, or the gateway's own in place of any answer (a Provider pick's
        # egress unreachable too): held whole, then answered as the data port answers it
        if self.resp_status >= 400 and self.decision is not None and (self.local or self._gateways_own_answer()):
            self.refused, self.resp_streaming = True, False
            self.resp_retry_after = h.get("retry-after")
        if served_ep and served_ep != self.pick and self.send is not None and self.snapshot is not None:
            moved = next((c for c in self.snapshot.candidates if c.is_local and c.model == self.send.candidate.model
                          and c.state.address == served_ep), None)  # type: ignore[union-attr]
            if moved is not None:
                self.send.move_to(moved, self.snapshot)
                # the answer names the backend that served it, as the accounting does
                self.resp_headers = [h for h in self.resp_headers if h.header.key != "x-kinference-backend"]
                self.resp_headers.append(_header("x-kinference-backend", moved.backend))
        if self.picker.settings.conformance_hooks:
            self.resp_headers.append(_header(HOOK_SERVED, served_ep or self.pick))
        end = msg.response_headers.end_of_stream
        if self.refused:
            return self._refusal() if end else []
        if self.restore is not None and not self.resp_streaming and not end:
            self.resp_held = bytearray()  # answered with the body: its length changes
            return []
        out = [self._response_headers_reply(None)]
        if end:
            self._finish()
        return out

    def _response_headers_reply(self, length: int | None) -> pb.ProcessingResponse:
        set_headers = list(self.resp_headers)
        if length is not None:
            set_headers.append(_header("content-length", str(length)))
        return pb.ProcessingResponse(response_headers=pb.HeadersResponse(response=pb.CommonResponse(
            header_mutation=pb.HeaderMutation(set_headers=set_headers))))

    def _refusal(self) -> list[pb.ProcessingResponse]:
        """A pod's error status, answered as the data port answers it
        (``validate.upstream_refusal``): the router's envelope with the
        decision id, a 4xx's message and code, 401/403/404 and 5xx as 502.
        The gateway's own error in place of any answer (:meth:`_gateways_own_answer`)
        is a 502 saying so, and the decision's second event, as at the data port."""
        d, send = self.decision, self.send
        assert d is not None and d.candidate is not None
        backend = (send.candidate if send is not None else d.candidate).backend  # a Provider pick: no send here
        if self._gateways_own_answer():
            # no answer of the pod's reached the gateway (its connection failed, or was cut after the
            # request left: the gateway does not send that again); said as the data port says it
            err = ApiError(502, "upstream_error", f"{backend}: the gateway answered {self.resp_status} in place "
                           f"of the pod: its connection failed or was cut, and a request the pod may have "
                           f"received is not sent again")
            amended = retry.answered(d, err.code, err.message)
            asyncio.get_running_loop().call_soon(self.director.publish_decision, amended, self.decision_id,
                                                 self.traces, "upstream_error")
        else:
            err = ApiError(*validate.upstream_refusal(self.resp_status, bytes(self.resp_held or b""), backend,
                                                      self.resp_retry_after))
        err.headers = [("x-kinference-rule", d.rule or "unmatched"), ("x-kinference-backend", backend)]
        self.director.count(err.rule, err.code, "")  # as the data port counts it
        self._finish("error")
        return self._close(_error(err, self.decision_id))

    def _gateways_own_answer(self) -> bool:
        """The response is the gateway's own (no endpoint's answer reached it):
        a 5xx, and a gateway that reports the endpoint it sent to (as the
        shipped Envoy does) reported none for this one. Only a 5xx: a pod's
        4xx through a gateway that does not report (another in a mixed
        fleet) must stay the pod's."""
        return self.resp_status >= 500 and self.served is None and self.picker.gateway_reports_served

    def _response_body(self, chunk: bytes, end: bool) -> list[pb.ProcessingResponse]:
        if self.resp_first and (chunk or end) and not self.refused:  # a refusal has no first token (data port)
            self.resp_first = False
            if self.send is not None:
                self.send.first_token(streamed=self.resp_streaming and self.resp_status == 200)
        if self.resp_streaming:
            self.resp_tail = (self.resp_tail + chunk)[-4096:]
            if self.send is not None:
                self.send.streamed(chunk)
        elif self.resp_len + len(chunk) <= MAX_HELD_RESPONSE:
            if self.resp_held is None:
                self.resp_held = bytearray()  # kept for its usage
            self.resp_held += chunk
        self.resp_len += len(chunk)
        if self.refused:
            return self._refusal() if end else []
        if self.restore is not None and not self.resp_streaming:
            if self.resp_len <= MAX_HELD_RESPONSE and not end:
                return []
            held = self.restore.whole(bytes(self.resp_held or b""))
            out = []
            if self.resp_len <= MAX_HELD_RESPONSE:  # whole: with its new length
                out.append(self._response_headers_reply(len(held)))
                out += _streamed(held, request=False, end=True)
            else:  # too big to hold: passed on unchanged from here
                out.append(self._response_headers_reply(None))
                out += _streamed(held + chunk, request=False, end=end)
                self.restore = None
            if end:
                self._finish()
            return out
        if self.restore is not None:  # streamed: each whole line as it comes
            chunk = self.restore.feed(chunk) + (self.restore.flush() if end else b"")
            if not chunk and not end:
                return []
        out = _streamed(chunk, request=False, end=end)
        if end:
            self._finish()
        return out

    def _finish(self, outcome: str | None = None) -> None:
        """The response ended (or the stream did): usage read, the send finished."""
        if self.finished:
            return
        self.finished = True
        d = self.decision
        if d is None:
            return
        cand = d.candidate
        if outcome is None:
            outcome = "ok" if 0 < self.resp_status < 400 else "error"
            # a Provider send the egress answered is counted by the egress, which carried it out and saw how
            # it went; one the gateway answered itself (the egress unreachable) is counted here
            if self.local or self._gateways_own_answer():
                self.director.count(d.rule or "unmatched", "routed" if outcome == "ok" else "upstream_error",
                                    cand.type)
        if self.send is not None:
            obs = self.send.obs
            if self.resp_streaming:
                Director.usage_from_stream(self.resp_tail, obs)
            elif self.resp_held is not None and self.resp_len <= MAX_HELD_RESPONSE:
                Director.usage(bytes(self.resp_held), obs)
            self.send.finish(outcome)

    def close(self) -> None:
        """The stream ended: a send not finished was cut (the client or the gateway went away).
        A Provider pick's send is the egress's, which counts how it ended (abandoned too)."""
        if not self.finished and self.decision is not None:
            if self.local:
                self.director.count(self.decision.rule or "", "abandoned", "")
            self._finish("cancelled")


class Picker(pb_grpc.ExternalProcessorServicer):
    """The ext_proc servicer: one :class:`PickStream` per stream."""

    def __init__(self, router: Router, settings: EppSettings) -> None:
        self.router, self.settings = router, settings
        #: the data port's API paths and methods: the others are refused as it refuses them
        self.routes = router.api_routes()
        #: the gateway reports the endpoint it sent each request to (seen once): a response
        #: without that report is then the gateway's own answer (PickStream._gateways_own_answer)
        self.gateway_reports_served = False

    async def Process(self, request_iterator: AsyncIterator[pb.ProcessingRequest],  # noqa: N802 - gRPC's name
                      context: grpc.aio.ServicerContext) -> AsyncIterator[pb.ProcessingResponse]:
        stream = PickStream(self)
        try:
            async for msg in request_iterator:
                try:
                    out = await stream.on(msg)
                except Exception as exc:  # a bug must not leave the gateway waiting: answer in the envelope
                    log.exception("endpoint picker failed", error=type(exc).__name__)
                    if stream.decision is not None:
                        raise  # the request was sent on: only the stream can end
                    yield _error(ApiError(500, "internal_error", "the endpoint picker failed on this request"),
                                 stream.decision_id or new_decision_id())
                    return
                for resp in out:
                    yield resp
                if stream.closed:
                    return
        finally:
            stream.close()


class EppServer:
    """The gRPC server: the picker and the health services (``""`` and
    ``liveness``: serving while the process runs; ``readiness`` and the
    ext_proc service: once the router is ready, as its /readyz)."""

    def __init__(self, router: Router, settings: EppSettings) -> None:
        self.router, self.settings = router, settings
        self.server: grpc.aio.Server | None = None
        self.health = health_async.HealthServicer()
        self.port = 0
        self.picker: Picker | None = None
        self._watch: asyncio.Task[None] | None = None

    async def start(self, host: str, port: int) -> None:
        limit = self.router.settings.max_body_bytes + 1024 * 1024
        self.server = grpc.aio.server(options=[("grpc.max_receive_message_length", limit),
                                               ("grpc.max_send_message_length", limit)])
        self.picker = Picker(self.router, self.settings)
        pb_grpc.add_ExternalProcessorServicer_to_server(self.picker, self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        try:
            self.port = self.server.add_insecure_port(f"{host}:{port}")
        except RuntimeError:  # grpcio's "Failed to bind"
            self.port = 0
        if not self.port:
            raise OSError(f"cannot listen on {host}:{port} (in use, or not an address of this host)")
        for name in ("", "liveness"):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        await self._set_ready(self.router.ready())
        await self.server.start()
        self._watch = asyncio.create_task(self._watch_ready())

    async def _set_ready(self, ready: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if ready else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("readiness", EXT_PROC_SERVICE):
            await self.health.set(name, status)

    async def _watch_ready(self) -> None:
        ready = self.router.ready()
        while True:
            await asyncio.sleep(0.2)
            now = self.router.ready()
            if now != ready:
                ready = now
                await self._set_ready(ready)

    async def close(self, grace: float = 2.0) -> None:
        if self._watch is not None:
            await cancel_and_wait(self._watch)
        if self.server is not None:
            await self.health.enter_graceful_shutdown()
            await self.server.stop(grace)
