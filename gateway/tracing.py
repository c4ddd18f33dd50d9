"""The gateway's server span: one OpenTelemetry SERVER span per LLMService call, the root of what Triton
and the models record for it.

Turned on by the same ``OTEL_*`` environment as the models (``tracing.TracingSettings``, read
into ``GatewayConfig.tracing``); when it does not, ``GatewayTracing.from_settings`` returns None and the service runs no tracing code per call (a
``None`` check; the OpenTelemetry SDK is not even imported).

Which calls are traced (the gateway is where a trace may start):

- the caller sent a valid W3C ``traceparent`` (gRPC metadata): its sampled flag decides (parent-based).
  Sampled: the span is its child. Not sampled: no span, and the caller's headers go to Triton unchanged
  (as without tracing; tritonserver 2.51 then traces the request under them anyway, ignoring the flag);
- no (or a malformed) ``traceparent``: the span is a new trace's root when ``ratio_samples`` says so
  (``OTEL_TRACES_SAMPLER[_ARG]``: every call with the default sampler).

A traced Generate forwards the span's own context to Triton as ``traceparent`` (with the caller's
``tracestate``), so Triton's ``InferRequest`` span, and under it the ensemble's and our models', are its
children. The span is recorded after the call ends, with explicit times, through the models' exporter
(``ModelTracer``: a batch span processor with a bounded queue, exports with a timeout).

The OpenAI-compatible API's requests get the same span as OpenTelemetry's HTTP server conventions name and
describe it (``HTTPServerSpan``: ``POST /v1/completions``, ``http.*`` and ``url.*`` attributes; status ERROR for a
5xx or no response) with the same GenAI attributes (``gateway/openai/span.py``).

Attributes: ``rpc.system``/``rpc.service``/``rpc.method``, ``rpc.grpc.status_code``, and for Generate the
GenAI semantic conventions (``gen_ai.operation.name``, ``gen_ai.request.{model, max_tokens, temperature,
top_p, top_k, seed, choice.count, stream}``, ``gen_ai.usage.{input,output}_tokens``,
``gen_ai.response.{id, finish_reasons}``). A call ending with a non-OK status carries ``error.type`` (the
code's name); status ERROR (with the message) is set for the codes the gRPC semantic conventions count as
server errors (``SERVER_ERROR_CODES``), not for a client's own mistakes or cancellations.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc

import tracing as t
from tracing import ModelTracer, TracingSettings, parse_traceparent, ratio_samples

COMPONENT = "gateway"
RESOURCE_KEY = "triton_llm.component"
RPC_SERVICE = "triton_llm.v1.LLMService"
SERVER_ERROR_CODES = frozenset({grpc.StatusCode.UNKNOWN, grpc.StatusCode.DEADLINE_EXCEEDED,
                                grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.INTERNAL,
                                grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DATA_LOSS})


@dataclass
class ServerSpan:
    """One traced call: its own span context (known from the start, to forward) and what it learns."""

    tracer: ModelTracer
    method: str
    parent: Any                           # the caller's span context, or None for a new trace's root
    context: Any                          # this span's
    start_ns: int
    tracestate: str | None = None
    attributes: dict[str, Any] = field(default_factory=dict)
    code: grpc.StatusCode = grpc.StatusCode.OK
    message: str = ""

    @property
    def traceparent(self) -> str:
        return t.format_traceparent(self.context.trace_id, self.context.span_id)

    def upstream_metadata(self) -> tuple[tuple[str, str], ...]:
        """The trace headers for Triton: this span as the parent (and the caller's tracestate)."""
        md = (("traceparent", self.traceparent),)
        return md + (("tracestate", self.tracestate),) if self.tracestate else md

    def failed(self, exc: BaseException, context) -> None:
        """Note how the call ended, from the exception leaving the handler: an abort (its code and message
        are on ``context``), a cancellation (the client's, or the call's deadline), or anything else. Past the
        call's deadline, an ending with no code of its own is the deadline's (the upstream call has the same
        deadline: when its timer fires first, the abort that reports it can find the call already ended and leave
        no code on ``context``; the client sees DEADLINE_EXCEEDED either way)."""
        remaining = context.time_remaining()
        deadline = remaining is not None and remaining <= 0
        if isinstance(exc, (asyncio.CancelledError, GeneratorExit)):
            self.code = grpc.StatusCode.DEADLINE_EXCEEDED if deadline else grpc.StatusCode.CANCELLED
            self.message = "deadline exceeded" if deadline else "cancelled by the client"
            return
        code = context.code() if isinstance(exc, grpc.aio.AbortError) else None
        if isinstance(code, grpc.StatusCode) and code != grpc.StatusCode.OK:
            self.code = code
        else:
            self.code = grpc.StatusCode.DEADLINE_EXCEEDED if deadline else grpc.StatusCode.UNKNOWN
        self.message = (context.details() if code is not None else None) or \
            ("deadline exceeded" if deadline else f"{type(exc).__name__}: {exc}")

    def end(self) -> None:
        attrs = self.attributes
        attrs["rpc.grpc.status_code"] = self.code.value[0]
        error = None
        if self.code != grpc.StatusCode.OK:
            attrs["error.type"] = self.code.name
            if self.code in SERVER_ERROR_CODES:
                error = f"{self.code.name}: {self.message}"
        self.tracer.span(f"{RPC_SERVICE}/{self.method}", self.parent, self.start_ns, time.time_ns(), attrs,
                         kind="SERVER", error=error, context=self.context)


@dataclass
class HTTPServerSpan(ServerSpan):
    """An HTTP request's span (the OpenAI-compatible API): ``method`` is the HTTP method, ``route`` the path."""

    route: str = ""
    status: int | None = None       # the response's status code, once its start was sent

    def failed_with(self, exc: BaseException) -> None:
        """The request ended with ``exc`` instead of a response (the ASGI server answers 500 then)."""
        self.message = f"{type(exc).__name__}: {exc}"
        if self.status is None:
            self.attributes["error.type"] = type(exc).__qualname__

    def end(self) -> None:
        attrs = self.attributes
        error = None
        if self.status is not None:
            attrs["http.response.status_code"] = self.status
            if self.status >= 500:      # a 4xx is the client's: no error on a server span
                attrs["error.type"] = str(self.status)
                error = f"HTTP {self.status}" + (f": {self.message}" if self.message else "")
        else:
            attrs.setdefault("error.type", "_OTHER")
            error = self.message or "the request ended without a response"
        self.tracer.span(f"{self.method} {self.route}", self.parent, self.start_ns, time.time_ns(), attrs,
                         kind="SERVER", error=error, context=self.context)


class GatewayTracing:
    def __init__(self, tracer: ModelTracer):
        self.tracer = tracer

    @classmethod
    def from_settings(cls, settings: TracingSettings | None, exporter=None) -> GatewayTracing | None:
        """Tracing as ``settings`` (``GatewayConfig.tracing``, from the OTEL_* environment) ask, or None when off."""
        if settings is None:
            return None
        return cls(ModelTracer(settings, COMPONENT, exporter, resource_key=RESOURCE_KEY))

    def _sampled(self, metadata: Mapping[str, str]) -> tuple[Any, Any, str | None] | None:
        """(the caller's span context or None, this span's context, the caller's tracestate), or None when the
        call is not traced (see the module's docstring)."""
        caller = parse_traceparent(metadata.get("traceparent"))
        if caller is not None:
            if not caller.sampled:
                return None
            parent = self.tracer.parent({"traceparent": metadata["traceparent"]})
            return parent, self.tracer.new_context(parent), metadata.get("tracestate")
        context = self.tracer.new_context()
        if not ratio_samples(context.trace_id, self.tracer.settings.ratio):
            return None
        return None, context, None

    def start(self, method: str, metadata: Mapping[str, str], start_ns: int) -> ServerSpan | None:
        """An LLMService call's span, or None when this call is not traced."""
        sampled = self._sampled(metadata)
        if sampled is None:
            return None
        attrs = {"rpc.system": "grpc", "rpc.service": RPC_SERVICE, "rpc.method": method}
        return ServerSpan(self.tracer, method, *sampled[:2], start_ns, sampled[2], attrs)

    def start_http(self, method: str, route: str, scheme: str, headers: Mapping[str, str],
                   start_ns: int) -> HTTPServerSpan | None:
        """An HTTP request's span (``headers``: its trace headers, lower-case), or None when it is not traced."""
        sampled = self._sampled(headers)
        if sampled is None:
            return None
        attrs = {"http.request.method": method, "url.path": route, "http.route": route, "url.scheme": scheme}
        return HTTPServerSpan(self.tracer, method, *sampled[:2], start_ns, sampled[2], attrs, route=route)

    def shutdown(self, timeout_s: float = 2.0) -> bool:
        return self.tracer.shutdown(timeout_s)


def generate_attributes(request, request_id: str, model: str, triton_model: str) -> dict[str, Any]:
    """A Generate call's request attributes (GenAI semantic conventions), read from the typed request."""
    has = request.HasField
    return {
        t.GEN_AI_OPERATION_NAME: "chat" if request.WhichOneof("input") == "messages" else "text_completion",
        t.GEN_AI_REQUEST_MODEL: model,
        t.GEN_AI_REQUEST_MAX_TOKENS: request.max_tokens,
        t.GEN_AI_REQUEST_TEMPERATURE: round(request.temperature, 6) if has("temperature") else None,
        t.GEN_AI_REQUEST_TOP_P: round(request.top_p, 6) if has("top_p") else None,
        t.GEN_AI_REQUEST_TOP_K: request.top_k if has("top_k") else None,
        t.GEN_AI_REQUEST_SEED: request.seed if has("seed") else None,
        t.GEN_AI_REQUEST_CHOICE_COUNT: request.num_return_sequences if has("num_return_sequences") else None,
        t.GEN_AI_REQUEST_STREAM: request.stream if has("stream") else False,
        t.GEN_AI_REQUEST_STOP_SEQUENCES: list(request.stop_words) or None,
        t.GEN_AI_RESPONSE_ID: request_id,
        t.ATTR_PREFIX + "triton_model": triton_model,
    }


def usage_attributes(*assemblers) -> dict[str, Any]:
    """What the ensemble's responses said (``mapping.ResponseAssembler``, one per prompt): token counts, finish
    reasons."""
    seqs = [a.sequences[i] for a in assemblers for i in sorted(a.sequences)]
    reasons = [s.finish_reason for s in seqs if s.finish_reason]
    return {
        t.GEN_AI_USAGE_INPUT_TOKENS: sum(a.prompt_tokens for a in assemblers) or None,
        t.GEN_AI_USAGE_OUTPUT_TOKENS: sum(s.output_tokens for s in seqs) if seqs else None,
        t.GEN_AI_RESPONSE_FINISH_REASONS: reasons or None,
    }
