"""A Python ext_proc client that talks to an Endpoint Picker as Envoy does
with headers SEND, bodies FULL_DUPLEX_STREAMED and trailers SEND, so tests
can drive the EPP without an Envoy, and Envoy tests can compare.

``EppClient(port).exchange(...)`` runs one stream: the request phase (headers,
body chunks), then, given a response, the response phase.
``EppClient.roundtrip(...)`` also plays the gateway's part: it sends the
mutated request to the picked destination with aiohttp and feeds the
answer back through the EPP, returning what the client would get.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import aiohttp
import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from google.protobuf import json_format, struct_pb2


def headers_message(headers: dict[str, str], *, end_of_stream: bool) -> pb.HttpHeaders:
    return pb.HttpHeaders(headers=base_pb2.HeaderMap(headers=[
        base_pb2.HeaderValue(key=k.lower(), raw_value=v.encode()) for k, v in headers.items()]),
        end_of_stream=end_of_stream)


def metadata(values: dict[str, dict[str, Any]]) -> base_pb2.Metadata:
    """Filter metadata {namespace: {key: value}} (value a str or a list)."""
    md = base_pb2.Metadata()
    for ns, kv in values.items():
        s = struct_pb2.Struct()
        s.update(kv)
        md.filter_metadata[ns].CopyFrom(s)
    return md


def immediate_headers(msg: pb.ImmediateResponse) -> dict[str, str]:
    return {h.header.key: h.header.raw_value.decode() for h in msg.headers.set_headers}


@dataclass
class RequestPhase:
    """What the EPP answered to the request: an ImmediateResponse, or a
    headers response plus the streamed body."""

    immediate: pb.ImmediateResponse | None = None
    set_headers: dict[str, str] = field(default_factory=dict)
    remove_headers: list[str] = field(default_factory=list)
    clear_route_cache: bool = False
    dynamic_metadata: dict[str, Any] = field(default_factory=dict)
    body: bytes = b""
    chunks: list[int] = field(default_factory=list)
    #: the kinds of the messages received, in order
    kinds: list[str] = field(default_factory=list)

    @property
    def destination(self) -> str | None:
        return self.set_headers.get("x-gateway-destination-endpoint")

    @property
    def status(self) -> int:
        return self.immediate.status.code if self.immediate is not None else 0


@dataclass
class ResponsePhase:
    set_headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    kinds: list[str] = field(default_factory=list)
    #: the EPP answered the response itself (a pod's refusal, in the router's envelope)
    immediate: pb.ImmediateResponse | None = None


def _mutation(m: pb.HeaderMutation) -> tuple[dict[str, str], list[str]]:
    return ({h.header.key: (h.header.raw_value.decode() if h.header.raw_value else h.header.value)
             for h in m.set_headers}, list(m.remove_headers))


class Stream:
    """One Process stream."""

    def __init__(self, stub: pb_grpc.ExternalProcessorStub) -> None:
        self.call = stub.Process()

    async def send(self, **kw: Any) -> None:
        await self.call.write(pb.ProcessingRequest(**kw))

    async def recv(self, timeout: float = 10.0) -> pb.ProcessingResponse:
        import asyncio

        msg = await asyncio.wait_for(self.call.read(), timeout)
        if msg is grpc.aio.EOF:
            raise EOFError("the EPP closed the stream")
        return msg

    async def request(self, method: str, path: str, headers: dict[str, str], body: bytes | None, *,
                      chunk: int = 16384, subset: Any = None, trailers: bool = False,
                      extra_metadata: dict[str, dict[str, Any]] | None = None) -> RequestPhase:
        hdrs = {":method": method, ":path": path, ":authority": "gateway", ":scheme": "http", **headers}
        if body is not None:
            hdrs.setdefault("content-type", "application/json")
            hdrs["content-length"] = str(len(body))
        md_values: dict[str, dict[str, Any]] = dict(extra_metadata or {})
        if subset is not None:
            md_values["envoy.lb.subset_hint"] = {"x-gateway-destination-endpoint-subset": subset}
        kw: dict[str, Any] = {"metadata_context": metadata(md_values)} if md_values else {}
        await self.send(request_headers=headers_message(hdrs, end_of_stream=body is None), **kw)
        out = RequestPhase()
        if body is None:
            return await self._collect(out, want_body=False)
        # full duplex: the body follows at once, without waiting for an answer
        parts = [body[i:i + chunk] for i in range(0, len(body), chunk)] or [b""]
        for n, part in enumerate(parts):
            last = n == len(parts) - 1
            await self.send(request_body=pb.HttpBody(body=part, end_of_stream=last and not trailers))
        if trailers:
            await self.send(request_trailers=pb.HttpTrailers(trailers=base_pb2.HeaderMap()))
        return await self._collect(out, want_body=True, trailers=trailers)

    async def _collect(self, out: RequestPhase, *, want_body: bool, trailers: bool = False) -> RequestPhase:
        while True:
            msg = await self.recv()
            kind = msg.WhichOneof("response")
            out.kinds.append(kind)
            if kind == "immediate_response":
                out.immediate = msg.immediate_response
                return out
            if kind == "request_headers":
                common = msg.request_headers.response
                out.set_headers, out.remove_headers = _mutation(common.header_mutation)
                out.clear_route_cache = common.clear_route_cache
                out.dynamic_metadata = json_format.MessageToDict(msg.dynamic_metadata)
                if not want_body:
                    return out
            elif kind == "request_body":
                sb = msg.request_body.response.body_mutation.streamed_response
                out.body += sb.body
                out.chunks.append(len(sb.body))
                if sb.end_of_stream and not trailers:
                    return out
            elif kind == "request_trailers":
                return out

    async def response(self, status: int, headers: dict[str, str], chunks: list[bytes], *,
                       served: str | None = None) -> ResponsePhase:
        hdrs = {":status": str(status), **headers}
        kw: dict[str, Any] = {}
        if served is not None:
            kw["metadata_context"] = metadata({"envoy.lb": {"x-gateway-destination-endpoint-served": served}})
        await self.send(response_headers=headers_message(hdrs, end_of_stream=not chunks), **kw)
        for n, c in enumerate(chunks):
            await self.send(response_body=pb.HttpBody(body=c, end_of_stream=n == len(chunks) - 1))
        out = ResponsePhase()
        while True:
            msg = await self.recv()
            kind = msg.WhichOneof("response")
            out.kinds.append(kind)
            if kind == "immediate_response":
                out.immediate = msg.immediate_response
                return out
            if kind == "response_headers":
                out.set_headers, _ = _mutation(msg.response_headers.response.header_mutation)
                if not chunks:
                    return out
            elif kind == "response_body":
                sb = msg.response_body.response.body_mutation.streamed_response
                out.body += sb.body
                if sb.end_of_stream:
                    return out

    async def close(self) -> None:
        await self.call.done_writing()
        self.call.cancel()


@dataclass
class RoundTrip:
    request: RequestPhase
    status: int
    headers: dict[str, str]
    body: bytes
    response: ResponsePhase | None = None


class EppClient:
    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        self.channel = grpc.aio.insecure_channel(f"{host}:{port}")
        self.stub = pb_grpc.ExternalProcessorStub(self.channel)

    def stream(self) -> Stream:
        return Stream(self.stub)

    async def exchange(self, path: str, headers: dict[str, str], body: bytes | None, **kw: Any) -> RequestPhase:
        """The request phase; a routed request then gets an empty 200 answer,
        so that the EPP has finished its send when this returns."""
        s = self.stream()
        try:
            rq = await s.request("POST" if body is not None else "GET", path, headers, body, **kw)
            if rq.immediate is None:
                await s.response(200, {"content-type": "application/json"}, [])
            return rq
        finally:
            await s.close()

    async def roundtrip(self, path: str, body: bytes, headers: dict[str, str] | None = None, *,
                        session: aiohttp.ClientSession, served: str | None = None, **kw: Any) -> RoundTrip:
        """Request phase; then, as a gateway, POST the mutated request to the
        destination's first endpoint (or ``served``) and pass the answer
        back through the EPP (in chunks as they arrive)."""
        s = self.stream()
        try:
            rq = await s.request("POST", path, dict(headers or {}), body, **kw)
            if rq.immediate is not None:
                return RoundTrip(rq, rq.status, immediate_headers(rq.immediate), rq.immediate.body)
            target = served or rq.destination.split(",")[0]  # type: ignore[union-attr]
            up_headers = {k: v for k, v in {**(headers or {}), **rq.set_headers}.items()
                          if k not in rq.remove_headers and not k.startswith(":")}
            async with session.post(f"http://{target}{path}", data=rq.body, headers=up_headers) as r:
                data = await r.read()
                rh = {k.lower(): v for k, v in r.headers.items()
                      if k.lower() not in ("content-length", "transfer-encoding", "date", "server")}
                status = r.status
            chunks = [data[i:i + 4096] for i in range(0, len(data), 4096)] or [b""]
            rp = await s.response(status, rh, chunks, served=target)
            if rp.immediate is not None:
                return RoundTrip(rq, rp.immediate.status.code, immediate_headers(rp.immediate),
                                 rp.immediate.body, rp)
            return RoundTrip(rq, status, {**rh, **rp.set_headers}, rp.body, rp)
        finally:
            await s.close()

    async def close(self) -> None:
        await self.channel.close()
