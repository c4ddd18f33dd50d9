"""A scriptable stand-in for Triton's KServe v2 gRPC service (grpc.aio), for gateway tests without a server.

``FakeTriton.script(request)`` returns what the ensemble answers one ``ModelInferRequest`` with: a list
of ``ModelStreamInferResponse``s, where the string ``"hang"`` waits until the call is cancelled, a number
sleeps that many seconds, and ``"close"`` ends the stream at once. It
records every request, the invocation metadata of every stream, and how many streams were cancelled.
``harness`` runs the gateway in front of one (``span_exporter``: where its server spans go).
"""
from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health_pb2_grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

from gateway import server as gw_server
from gateway.config import GatewayConfig
from gateway.upstream import ENGINE_MODEL, PREPROCESS_MODEL
from triton_llm.v1 import llm_service_pb2 as pb
from triton_llm.v1 import llm_service_pb2_grpc as pb_grpc


def _bytes(*items: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(b)) + b for b in items)


def response(text: str = "", *, finish: str = "", seq: int = 0, n_in: int = 4, n_out: int = 1, final: bool = False,
             logprobs: list[float] | None = None, cum: float = 0.0, extra: dict | None = None,
             rid: str = "") -> service_pb2.ModelStreamInferResponse:
    """One ensemble response with the ensemble's outputs, encoded by hand (not by the gateway's code)."""
    r = service_pb2.ModelInferResponse(model_name="ensemble", id=rid)
    outputs = [("text_output", "BYTES", [1, 1], _bytes(text.encode())),
               ("finish_reason", "BYTES", [1, 1], _bytes(finish.encode())),
               ("cum_log_probs", "FP32", [1, 1], struct.pack("<f", cum)),
               ("output_log_probs", "FP32", [1, len(logprobs or [])], struct.pack(f"<{len(logprobs or [])}f", *(logprobs or []))),
               ("num_input_tokens", "INT32", [1, 1], struct.pack("<i", n_in)),
               ("num_output_tokens", "INT32", [1, 1], struct.pack("<i", n_out)),
               ("sequence_index", "INT32", [1, 1], struct.pack("<i", seq))]
    for name, (dtype, raw) in (extra or {}).items():
        outputs.append((name, dtype, [1, 1], raw))
    for name, dtype, shape, raw in outputs:
        t = r.outputs.add()
        t.name, t.datatype = name, dtype
        t.shape.extend(shape)
        r.raw_output_contents.append(raw)
    r.parameters["triton_final_response"].bool_param = final
    return service_pb2.ModelStreamInferResponse(infer_response=r)


def empty_final() -> service_pb2.ModelStreamInferResponse:
    r = service_pb2.ModelInferResponse(model_name="ensemble")
    r.parameters["triton_final_response"].bool_param = True
    return service_pb2.ModelStreamInferResponse(infer_response=r)


def error(message: str) -> service_pb2.ModelStreamInferResponse:
    return service_pb2.ModelStreamInferResponse(error_message=message)


def default_script(request: service_pb2.ModelInferRequest) -> list:
    return [response("hello", n_out=1), response(" world", finish="length", n_out=2, final=True)]


@dataclass
class FakeTriton(service_pb2_grpc.GRPCInferenceServiceServicer):
    ready: bool = True
    script: Callable[[service_pb2.ModelInferRequest], list] = default_script
    llm_parameters: dict[str, str] = field(default_factory=dict)
    preprocess_parameters: dict[str, str] = field(default_factory=dict)
    requests: list = field(default_factory=list)
    metadata: list[dict[str, str]] = field(default_factory=list)
    cancelled: int = 0
    streams: int = 0
    finished_streams: int = 0

    async def ModelReady(self, request, context):
        return service_pb2.ModelReadyResponse(ready=self.ready and request.name == "ensemble")

    async def ModelConfig(self, request, context):
        params = {ENGINE_MODEL: self.llm_parameters, PREPROCESS_MODEL: self.preprocess_parameters}.get(request.name)
        if params is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"Request for unknown model: '{request.name}' is not found")
        cfg = service_pb2.ModelConfigResponse()
        cfg.config.name = request.name
        for k, v in params.items():
            cfg.config.parameters[k].string_value = v
        return cfg

    async def ModelStreamInfer(self, request_iterator, context):
        self.streams += 1
        self.metadata.append({k: v for k, v in context.invocation_metadata() if isinstance(v, str)})
        try:
            async for req in request_iterator:
                self.requests.append(req)
                for item in self.script(req):
                    if item == "hang":
                        await asyncio.sleep(3600)
                    elif item == "close":  # end the stream (status OK) with the request unfinished
                        self.finished_streams += 1
                        return
                    elif isinstance(item, (int, float)):
                        await asyncio.sleep(item)
                    else:
                        yield item
            self.finished_streams += 1
        except asyncio.CancelledError:
            self.cancelled += 1
            raise


async def start_fake(fake: FakeTriton) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server()
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


def inputs_of(request: service_pb2.ModelInferRequest) -> dict[str, tuple[str, list[int], bytes]]:
    """name -> (datatype, shape, raw bytes) of a received request."""
    return {t.name: (t.datatype, list(t.shape), request.raw_input_contents[i]) for i, t in enumerate(request.inputs)}


def decode_input(dtype: str, raw: bytes) -> list:
    if dtype == "BYTES":
        out, i = [], 0
        while i < len(raw):
            (n,) = struct.unpack_from("<I", raw, i)
            out.append(raw[i + 4:i + 4 + n].decode())
            i += 4 + n
        return out
    fmt = {"BOOL": "?", "INT32": "i", "FP32": "f", "UINT64": "Q"}[dtype]
    return list(struct.unpack(f"<{len(raw) // struct.calcsize(fmt)}{fmt}", raw))


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


@contextlib.asynccontextmanager
async def harness(fake: FakeTriton | None = None, *, triton_url: str | None = None, channel_creds=None,
                  span_exporter=None, **config):
    """A gateway (in this event loop) in front of ``fake``: yields (gateway, LLMService stub, health stub, fake)."""
    fake = fake or FakeTriton()
    fake_server, port = await start_fake(fake)
    cfg = GatewayConfig(listen="127.0.0.1:0", triton_url=triton_url or f"127.0.0.1:{port}", health_interval_s=0.05,
                        grace_period_s=1.0, **config)
    gw = await gw_server.start(cfg, span_exporter=span_exporter)
    target = f"localhost:{gw.port}"
    channel = grpc.aio.secure_channel(target, channel_creds) if channel_creds else grpc.aio.insecure_channel(target)
    try:
        yield gw, pb_grpc.LLMServiceStub(channel), health_pb2_grpc.HealthStub(channel), fake
    finally:
        await channel.close()
        await gw.stop(grace=0)
        await fake_server.stop(0)


async def collect(call) -> list[pb.GenerateResponse]:
    """The rest of a Generate stream (read() rather than iteration, so a test may read() first)."""
    out = []
    while (msg := await call.read()) is not grpc.aio.EOF:
        out.append(msg)
    return out
