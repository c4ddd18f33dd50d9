"""The OpenAI-compatible API's server span (gateway/openai/span.py) against a fake Triton: named as OpenTelemetry's
HTTP conventions say (``POST /v1/completions``), with the HTTP attributes, the GenAI request and usage attributes
the gRPC ``Generate`` span has, the status of what the client got, and Triton's spans as its children."""
from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from tests.gateway.fake_triton import FakeTriton, error, response
from tests.gateway.openai_harness import FAKE_PARAMS, MODEL, served
from tracing import TracingSettings, parse_traceparent

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
CALLER = f"00-{TRACE_ID}-{CALLER_SPAN}-01"


@pytest.fixture(scope="module")
def srv():
    fake = FakeTriton(llm_parameters=dict(FAKE_PARAMS))
    with served(fake, tracing=TracingSettings("http://unused:1/v1/traces", schedule_delay_ms=10),
                span_exporter=InMemorySpanExporter(), auth_tokens=("tok",)) as s:
        yield s


@pytest.fixture()
def fake(srv):
    srv.fake.script = lambda req: [response("hello", n_out=1, n_in=5),
                                   response(" world", finish="length", n_out=2, n_in=5, final=True)]
    srv.fake.metadata.clear()
    return srv.fake


def spans(srv, n: int = 0) -> list:
    """The spans finished since the last call, once there are ``n`` (a span ends just after its response's last
    byte, so it may trail the client's read by a moment)."""
    async def flush():
        processor = srv.gw.service.tracing.tracer.processor
        for _ in range(500):
            processor.force_flush()
            finished = list(processor.span_exporter.get_finished_spans())
            if len(finished) >= n:
                break
            await asyncio.sleep(0.01)
        processor.span_exporter.clear()
        return finished
    return srv.call(flush())


def post(srv, path: str, body: dict, **headers) -> httpx.Response:
    headers = {"authorization": "Bearer tok", "traceparent": CALLER, **headers}
    return httpx.post(srv.base_url + path, json=body, headers=headers, timeout=30)


def test_a_completion_is_a_post_span_with_http_and_genai_attributes_and_triton_under_it(srv, fake):
    spans(srv)
    r = post(srv, "/v1/completions", {"model": MODEL, "prompt": "def f():", "max_tokens": 4, "temperature": 0.5,
                                      "seed": 3, "stop": ["\n"]}, **{"x-request-id": "rid-7"})
    assert r.status_code == 200, r.text
    span, = spans(srv, 1)
    assert span.name == "POST /v1/completions" and span.kind == SpanKind.SERVER
    assert format(span.context.trace_id, "032x") == TRACE_ID and format(span.parent.span_id, "016x") == CALLER_SPAN
    a = span.attributes
    assert (a["http.request.method"], a["url.path"], a["http.route"], a["url.scheme"],
            a["http.response.status_code"]) == ("POST", "/v1/completions", "/v1/completions", "http", 200)
    assert a["gen_ai.operation.name"] == "text_completion" and a["gen_ai.request.model"] == MODEL
    assert (a["gen_ai.request.max_tokens"], a["gen_ai.request.temperature"], a["gen_ai.request.seed"]) == (4, 0.5, 3)
    assert list(a["gen_ai.request.stop_sequences"]) == ["\n"] and a["gen_ai.response.id"] == "rid-7"
    assert a["gen_ai.usage.input_tokens"] == 5 and a["gen_ai.usage.output_tokens"] == 2
    assert list(a["gen_ai.response.finish_reasons"]) == ["length"]
    assert "error.type" not in a and span.status.status_code == StatusCode.UNSET
    forwarded = parse_traceparent(fake.metadata[-1]["traceparent"])
    assert (forwarded.trace_id, forwarded.span_id) == (span.context.trace_id, span.context.span_id)


def test_a_streamed_chat_span_ends_with_the_stream_and_counts_every_prompt(srv, fake):
    spans(srv)
    with httpx.stream("POST", srv.base_url + "/v1/chat/completions", timeout=30,
                      headers={"authorization": "Bearer tok", "traceparent": CALLER},
                      json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                            "stream": True}) as r:
        events = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    span, = spans(srv, 1)
    assert span.name == "POST /v1/chat/completions"
    a = span.attributes
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.request.stream"] is True
    assert a["http.response.status_code"] == 200 and a["gen_ai.usage.output_tokens"] == 2
    r = post(srv, "/v1/completions", {"model": MODEL, "prompt": ["a", "b"], "max_tokens": 4})
    assert len(r.json()["choices"]) == 2
    span, = spans(srv, 1)
    assert span.attributes["gen_ai.usage.input_tokens"] == 10 and span.attributes["gen_ai.usage.output_tokens"] == 4


def test_refused_requests_have_their_status_and_only_server_errors_are_errors(srv, fake):
    spans(srv)
    assert post(srv, "/v1/completions", {"model": "nope", "prompt": "x"}).status_code == 404
    assert post(srv, "/v1/completions", {"model": MODEL, "prompt": "x"}, authorization="Bearer bad").status_code == 401
    assert post(srv, "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": -1}).status_code == 400
    fake.script = lambda req: [error("in ensemble 'ensemble', something broke")]
    assert post(srv, "/v1/completions", {"model": MODEL, "prompt": "x"}).status_code == 500
    by_status = {s.attributes["http.response.status_code"]: s for s in spans(srv, 4)}
    assert sorted(by_status) == [400, 401, 404, 500]
    assert all(s.name == "POST /v1/completions" for s in by_status.values())
    for status in (400, 401, 404):
        assert by_status[status].status.status_code == StatusCode.UNSET
        assert "error.type" not in by_status[status].attributes
    assert by_status[500].status.status_code == StatusCode.ERROR and by_status[500].attributes["error.type"] == "500"


def test_other_routes_and_untraced_requests_have_no_span(srv, fake):
    spans(srv)
    assert httpx.get(srv.base_url + "/v1/models", headers={"authorization": "Bearer tok"}).status_code == 200
    unsampled = f"00-{TRACE_ID}-{CALLER_SPAN}-00"
    r = post(srv, "/v1/completions", {"model": MODEL, "prompt": "x"}, traceparent=unsampled)
    assert r.status_code == 200 and json.loads(r.text)["choices"][0]["text"] == "hello world"
    assert fake.metadata[-1]["traceparent"] == unsampled     # the caller's headers, unchanged
    assert post(srv, "/v1/completions", {"model": MODEL, "prompt": "x"}).status_code == 200
    assert [s.name for s in spans(srv, 1)] == ["POST /v1/completions"]   # the sampled one's alone
