"""The cheapest ext_proc service Python can be: the ceiling of any picker written in it.

``python -m bench.null_epp --port P --endpoint IP:PORT`` serves
``envoy.service.ext_proc.v3.ExternalProcessor/Process`` on grpc.aio (and
uvloop, as the router does) with nothing but the protocol's obligations in
the modes the Inference Extension's gateways configure (headers SEND, bodies
FULL_DUPLEX_STREAMED, trailers SEND): the request headers' answer held until
the body ends, then sent with ``clear_route_cache`` and a fixed
``x-gateway-destination-endpoint`` (header and ``envoy.lb`` metadata), every
body chunk echoed as a streamed response, every other message answered
empty. No decision, no accounting, no parsing of the body.

``make bench-epp`` runs it behind the same Envoy as Kinference's picker
(target ``envoy-null-epp``): the distance between the two is what the
picker's own work costs, and the null picker's rate is the most a Python
ext_proc service reaches on that core, whatever it does.

:func:`floor` splits the null picker's own CPU into what a stream costs
(opened, ended) and what one message costs: a gRPC client (in this process,
on another core) opens streams of one request's messages (4 to the picker,
4 answers) and streams of eight requests' messages back to back, and the
server's CPU time per stream of each gives both by difference.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from google.protobuf import struct_pb2

DESTINATION = "x-gateway-destination-endpoint"


class NullPicker(pb_grpc.ExternalProcessorServicer):
    def __init__(self, endpoint: str) -> None:
        md = struct_pb2.Struct()
        md.fields["envoy.lb"].struct_value.update({DESTINATION: endpoint})
        self.headers_reply = pb.ProcessingResponse(
            request_headers=pb.HeadersResponse(response=pb.CommonResponse(
                clear_route_cache=True, header_mutation=pb.HeaderMutation(set_headers=[
                    base_pb2.HeaderValueOption(header=base_pb2.HeaderValue(key=DESTINATION, raw_value=endpoint.encode()),
                                               append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD)]))),
            dynamic_metadata=md)

    async def Process(self, request_iterator: AsyncIterator[pb.ProcessingRequest],  # noqa: N802 - gRPC's name
                      context: grpc.aio.ServicerContext) -> AsyncIterator[pb.ProcessingResponse]:
        held = bytearray()
        async for msg in request_iterator:
            kind = msg.WhichOneof("request")
            if kind == "request_headers":
                if msg.request_headers.end_of_stream:
                    yield self.headers_reply
            elif kind == "request_body":
                held += msg.request_body.body
                if msg.request_body.end_of_stream:  # the body, whole, after the held headers' answer
                    yield self.headers_reply
                    yield pb.ProcessingResponse(request_body=pb.BodyResponse(response=pb.CommonResponse(
                        body_mutation=pb.BodyMutation(streamed_response=pb.StreamedBodyResponse(
                            body=bytes(held), end_of_stream=True)))))
            elif kind == "response_body":
                b = msg.response_body
                yield pb.ProcessingResponse(response_body=pb.BodyResponse(response=pb.CommonResponse(
                    body_mutation=pb.BodyMutation(streamed_response=pb.StreamedBodyResponse(
                        body=b.body, end_of_stream=b.end_of_stream)))))
            elif kind == "response_headers":
                yield pb.ProcessingResponse(response_headers=pb.HeadersResponse())
            elif kind == "request_trailers":
                yield pb.ProcessingResponse(request_trailers=pb.TrailersResponse())
            elif kind == "response_trailers":
                yield pb.ProcessingResponse(response_trailers=pb.TrailersResponse())


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _request_messages() -> list[tuple[pb.ProcessingRequest, int]]:
    """One plain request as the gateway sends it, with the answers each message gets."""
    hdrs = pb.HttpHeaders(headers=base_pb2.HeaderMap(headers=[
        base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in (
            (":method", "POST"), (":path", "/v1/chat/completions"), ("content-type", "application/json"))]))
    body = b'{"model":"m","messages":[{"role":"user","content":"' + b"x" * 400 + b'"}]}'
    return [(pb.ProcessingRequest(request_headers=hdrs), 0),
            (pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=True)), 2),
            (pb.ProcessingRequest(response_headers=pb.HttpHeaders(headers=base_pb2.HeaderMap(headers=[
                base_pb2.HeaderValue(key=":status", raw_value=b"200")]))), 1),
            (pb.ProcessingRequest(response_body=pb.HttpBody(body=b'{"choices":[]}' * 20, end_of_stream=True)), 1)]


async def _streams(port: int, per_stream: int, seconds: float, concurrency: int) -> int:
    msgs = _request_messages() * per_stream
    done = 0
    stop = time.monotonic() + seconds
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        stub = pb_grpc.ExternalProcessorStub(ch)

        async def one() -> None:
            nonlocal done
            while time.monotonic() < stop:
                call = stub.Process()
                for m, answers in msgs:
                    await call.write(m)
                    for _ in range(answers):
                        await call.read()
                await call.done_writing()
                while await call.read() is not grpc.aio.EOF:
                    pass
                done += 1

        await asyncio.gather(*(one() for _ in range(concurrency)))
    return done


def floor(server_cpu: int | None, client_cpu: int | None, seconds: float = 3.0,
          concurrency: int = 16) -> dict[str, float]:
    """The null picker's CPU per stream and per message (microseconds),
    with its server pinned to ``server_cpu``."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    pin = ["taskset", "-c", str(server_cpu)] if server_cpu is not None else []
    proc = subprocess.Popen([*pin, sys.executable, "-m", "bench.null_epp", "--port", str(port), "--endpoint",
                             "127.0.0.1:1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        assert proc.stdout is not None
        proc.stdout.readline()  # listening
        if client_cpu is not None:
            os.sched_setaffinity(0, {client_cpu})
        out: dict[str, float] = {}
        for k in (1, 8):
            asyncio.run(_streams(port, k, 1.0, concurrency))  # warm-up
            c0 = _cpu_seconds(proc.pid)
            n = asyncio.run(_streams(port, k, seconds, concurrency))
            out[f"us_per_stream_of_{k}"] = (_cpu_seconds(proc.pid) - c0) / max(n, 1) * 1e6
        # a stream of k requests' messages: S + 8k m (4 messages in, 4 answers per request)
        per_msg = (out["us_per_stream_of_8"] - out["us_per_stream_of_1"]) / (64 - 8)
        return {"us_per_message": round(per_msg, 1),
                "us_per_stream": round(out["us_per_stream_of_1"] - 8 * per_msg, 1),
                "us_per_request": round(out["us_per_stream_of_1"], 1)}
    finally:
        proc.kill()
        proc.wait()


async def serve(port: int, endpoint: str) -> None:
    server = grpc.aio.server()
    pb_grpc.add_ExternalProcessorServicer_to_server(NullPicker(endpoint), server)
    if not server.add_insecure_port(f"127.0.0.1:{port}"):
        raise SystemExit(f"null_epp: cannot listen on 127.0.0.1:{port}")
    await server.start()
    print(f"null ext_proc on 127.0.0.1:{port} -> {endpoint}", flush=True)
    await server.wait_for_termination()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.null_epp", description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, required=True, help="the gRPC port to listen on (127.0.0.1)")
    p.add_argument("--endpoint", required=True, help="the ip:port every request is sent to")
    p.add_argument("--no-uvloop", action="store_true", help="asyncio's own event loop")
    args = p.parse_args(argv)
    if args.no_uvloop:
        asyncio.run(serve(args.port, args.endpoint))
    else:
        import uvloop
        uvloop.run(serve(args.port, args.endpoint))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
