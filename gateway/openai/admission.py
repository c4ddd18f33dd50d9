"""What every generation request passes before it reaches Triton, with the gRPC service's own settings.

The bearer tokens (``Authorization: Bearer``: 401 ``invalid_api_key``), the served model's name (404
``model_not_found``), Triton's readiness (503 with ``Retry-After``) and the gateway's one concurrency
limit, shared with the gRPC ``Generate`` calls (429 ``rate_limit_exceeded`` with ``Retry-After``).
``Admitted`` is the slot: release it once the response is over.
"""
from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass

import grpc
from fastapi import Request

from gateway.service import TRACE_HEADERS, LLMService
from gateway.tracing import HTTPServerSpan

from .errors import APIError
from .runner import Runner
from .span import span_of, usage

log = logging.getLogger("gateway")

MAX_REQUEST_ID_CHARS = 128


def check_auth(service: LLMService, request: Request) -> None:
    tokens = service.tokens
    if tokens is None or not tokens.enabled:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip() or not tokens.check(token.strip()):
        raise APIError(401, "invalid or missing API key: send 'Authorization: Bearer <token>'",
                       code="invalid_api_key")


async def served_names(service: LLMService) -> list[str]:
    """The names a request's ``model`` may take: the served checkpoint's, Triton's model name, and each LoRA
    adapter's (a request naming an adapter runs under it: ``lora_name``)."""
    upstream = service.upstream
    try:
        facts = await upstream.facts()
    except grpc.aio.AioRpcError:
        raise APIError(503, f"Triton at {upstream.url} is unavailable; retry", code="model_not_ready",
                       headers={"Retry-After": "1"}) from None
    return [n for n in dict.fromkeys([facts.name, upstream.model, *facts.lora_adapters]) if n]


@dataclass
class Admitted:
    service: LLMService
    request_id: str
    metadata: tuple[tuple[str, str], ...]
    span: HTTPServerSpan | None = None
    runner: Runner | None = None        # set once the request is built: its usage goes on the span at release
    released: bool = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.service.inflight -= 1
            usage(self.span, self.runner)


async def admit(service: LLMService, request: Request, model: str) -> Admitted:
    """After ``check_auth`` (the routes' dependency): readiness, the model's name, a slot of the limit."""
    upstream = service.upstream
    if not upstream.ready:
        raise APIError(503, f"Triton's {upstream.model!r} model is not ready; retry", code="model_not_ready",
                       headers={"Retry-After": "1"})
    names = await served_names(service)
    if model not in names:
        raise APIError(404, f"The model {model!r} does not exist; this server serves {names}",
                       param="model", code="model_not_found")
    if service.inflight >= service.max_inflight:
        raise APIError(429, f"too many requests in flight (limit {service.max_inflight}); retry later",
                       code="rate_limit_exceeded", headers={"Retry-After": "1"})
    rid = request.headers.get("x-request-id", "")
    if not (0 < len(rid) <= MAX_REQUEST_ID_CHARS and rid.isascii() and rid.isprintable() and " " not in rid):
        rid = uuid.uuid4().hex
    headers = {k: request.headers[k] for k in TRACE_HEADERS if k in request.headers}
    span = span_of(request)     # the request's server span (span.py), the parent of Triton's spans
    metadata = span.upstream_metadata() if span is not None else tuple(headers.items())
    service.inflight += 1
    return Admitted(service, rid, metadata, span)
