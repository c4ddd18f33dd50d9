"""A small typed client of LLMService (used by ``python -m cli.client --gateway``): ``generate`` streams
one request, ``generate_request`` builds one from the ensemble-named values the CLI collects.

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


# The ensemble's guided_decoding_guide_type -> the GuidedDecoding case that carries it.
GUIDE_CASES = {"json": "any_json", "json_schema": "json_schema", "regex": "regex", "ebnf_grammar": "ebnf_grammar",
               "structural_tag": "structural_tag"}


def generate_request(prompt: str, *, chat: bool = False, guide_type: str | None = None, guide: str = "",
                     **fields) -> pb.GenerateRequest:
    """A GenerateRequest from ensemble-named values: ``prompt`` (a user message when ``chat``), the
    guide as the ensemble's type and text, and scalar, list or map fields named as in the proto (None: unset)."""
    req = pb.GenerateRequest()
    if chat:
        req.messages.messages.add(role="user", content=prompt)
    else:
        req.prompt = prompt
    for name, value in fields.items():
        if value is None:
            continue
        if isinstance(value, (list, tuple)):
            getattr(req, name).extend(value)
        elif isinstance(value, dict):          # a map field (logit_bias)
            getattr(req, name).update(value)
        else:
            setattr(req, name, value)
    if guide_type is not None:
        case = GUIDE_CASES.get(guide_type)
        if case is None:
            raise ValueError(f"guide_type: expected one of {sorted(GUIDE_CASES)}, got {guide_type!r}")
        if case == "any_json":
            req.guided_decoding.any_json.SetInParent()
        else:
            setattr(req.guided_decoding, case, guide)
    return req
