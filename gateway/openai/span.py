"""The OpenAI-compatible API's server span: one per generation request, named and described as OpenTelemetry's
HTTP server conventions say (``POST /v1/completions``, ``POST /v1/chat/completions``; ``gateway/tracing.py``).

``ServerSpans`` is an ASGI middleware, outside every other, so the span covers the whole request, those refused
(401, 404, 413, 429, ...) included, and ends once the response is over (a stream's last event sent). It decides
whether the request is traced as the gRPC API does (the caller's ``traceparent``, else the sampler), and leaves
the span in the ASGI scope: ``span_of(request)``. Admission forwards its context to Triton, so Triton's spans are
its children; the routes add the GenAI request attributes (``request_attributes``) and, at the end, the usage
(``usage``), as the gRPC ``Generate`` does.
"""
from __future__ import annotations

import time
from typing import Any

from fastapi import Request

from gateway.service import TRACE_HEADERS
from gateway.tracing import GatewayTracing, HTTPServerSpan, generate_attributes, usage_attributes

ROUTES = frozenset({"/v1/completions", "/v1/chat/completions"})
SCOPE_KEY = "triton_llm.span"


class ServerSpans:
    def __init__(self, app, tracing: GatewayTracing) -> None:
        self.app = app
        self.tracing = tracing

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in ROUTES:
            return await self.app(scope, receive, send)
        headers = {}
        for key, value in scope.get("headers") or ():
            name = key.decode("latin-1").lower()
            if name in TRACE_HEADERS:
                headers[name] = value.decode("latin-1")
        span = self.tracing.start_http("POST", scope["path"], scope.get("scheme", "http"), headers, time.time_ns())
        if span is None:
            return await self.app(scope, receive, send)
        scope[SCOPE_KEY] = span

        async def send_noting_status(message) -> None:
            if message["type"] == "http.response.start":
                span.status = message["status"]
            await send(message)
        try:
            await self.app(scope, receive, send_noting_status)
        except BaseException as e:
            span.failed_with(e)
            raise
        finally:
            span.end()


def span_of(request: Request) -> HTTPServerSpan | None:
    """The request's span (None: tracing is off, or this request is not traced)."""
    return request.scope.get(SCOPE_KEY)


def request_attributes(span: HTTPServerSpan | None, requests: list, request_id: str, model: str,
                       triton_model: str) -> None:
    """The GenAI request attributes of the typed ``requests`` (one per prompt; the first describes them)."""
    if span is not None and requests:
        span.attributes.update(generate_attributes(requests[0], request_id, model, triton_model))


def usage(span: HTTPServerSpan | None, runner: Any) -> None:
    """Token counts and finish reasons over every prompt of ``runner`` (``runner.Runner``)."""
    if span is not None and runner is not None:
        span.attributes.update(usage_attributes(*(g.assembler for g in runner.generations)))
