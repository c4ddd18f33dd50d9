"""A small typed client of LLMService (used by ``python -m cli.client --gateway``).

    for msg in generate("localhost:50051", pb.GenerateRequest(prompt="def f():", max_tokens=32, stream=True)):
        print(msg.text, end="")

``token`` adds ``authorization: Bearer <token>``; ``root_certificates`` (PEM bytes) turns on TLS.
"""
from __future__ import annotations

from typing import Iterator

import grpc

from triton_llm.v1 import llm_service_pb2 as pb
from triton_llm.v1 import llm_service_pb2_grpc as pb_grpc


def channel(target: str, root_certificates: bytes | None = None) -> grpc.Channel:
    if root_certificates is not None:
        return grpc.secure_channel(target, grpc.ssl_channel_credentials(root_certificates))
    return grpc.insecure_channel(target)


def metadata(token: str | None = None, traceparent: str | None = None) -> tuple[tuple[str, str], ...]:
    md = []
    if token:
        md.append(("authorization", f"Bearer {token}"))
    if traceparent:
        md.append(("traceparent", traceparent))
    return tuple(md)


def generate(target: str, request: pb.GenerateRequest, *, token: str | None = None, timeout: float | None = None,
             root_certificates: bytes | None = None) -> Iterator[pb.GenerateResponse]:
    """Yield the stream's messages; raises ``grpc.RpcError`` with the gateway's status on failure."""
    with channel(target, root_certificates) as ch:
        yield from pb_grpc.LLMServiceStub(ch).Generate(request, metadata=metadata(token), timeout=timeout)
