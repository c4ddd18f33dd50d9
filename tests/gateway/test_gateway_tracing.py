"""The gateway's server span (gateway/tracing.py) against a fake Triton: its parent, its attributes, its status,
which calls are traced, and the traceparent it forwards (its own span id, so Triton's spans become its children).
The whole tree through the real tritonserver is in tests/e2e/test_gateway_tracing.py."""
from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from tracing import TracingSettings, parse_traceparent
from gateway.config import REPO, ConfigError, from_args
from tests.gateway.fake_triton import FakeTriton, collect, error, harness, response, run
from triton_llm.v1 import llm_service_pb2 as pb

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
CALLER = f"00-{TRACE_ID}-{CALLER_SPAN}-01"
GENERATE = "triton_llm.v1.LLMService/Generate"


def settings(**kw) -> TracingSettings:
    return TracingSettings("http://unused:1/v1/traces", schedule_delay_ms=10, **kw)


def traced(fake: FakeTriton | None = None, exporter: InMemorySpanExporter | None = None, **kw):
    return harness(fake, tracing=settings(**kw), span_exporter=exporter or InMemorySpanExporter())


def spans_of(gw) -> list:
    gw.service.tracing.tracer.processor.force_flush()
    return list(gw.service.tracing.tracer.processor.span_exporter.get_finished_spans())


async def failing(call) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await collect(call)
    return e.value


def test_the_span_is_the_callers_child_and_the_parent_of_what_triton_records():
    async def body():
        async with traced() as (gw, stub, _, fake):
            request = pb.GenerateRequest(prompt="def f():", max_tokens=4, temperature=0.7, top_k=5, seed=11,
                                         stream=True, stop_words=["\n"], request_id="rid-1")
            t0 = time.time_ns()
            out = await collect(stub.Generate(request, metadata=(("traceparent", CALLER), ("tracestate", "v=1"))))
            t1 = time.time_ns()
            assert "".join(m.text for m in out) == "hello world"
            span, = spans_of(gw)
        assert span.name == GENERATE and span.kind == SpanKind.SERVER
        assert format(span.context.trace_id, "032x") == TRACE_ID
        assert format(span.parent.span_id, "016x") == CALLER_SPAN and span.parent.is_remote
        assert t0 <= span.start_time <= span.end_time <= t1
        # Triton was given the gateway's span as the parent, and the caller's tracestate
        forwarded = parse_traceparent(fake.metadata[0]["traceparent"])
        assert (forwarded.trace_id, forwarded.span_id, forwarded.sampled) == (span.context.trace_id,
                                                                              span.context.span_id, True)
        assert forwarded.span_id != int(CALLER_SPAN, 16) and fake.metadata[0]["tracestate"] == "v=1"
        a = span.attributes
        assert (a["rpc.system"], a["rpc.service"], a["rpc.method"], a["rpc.grpc.status_code"]) == \
            ("grpc", "triton_llm.v1.LLMService", "Generate", 0)
        assert a["gen_ai.operation.name"] == "text_completion" and a["gen_ai.request.model"] == "ensemble"
        assert a["gen_ai.request.max_tokens"] == 4 and a["gen_ai.request.temperature"] == 0.7
        assert a["gen_ai.request.top_k"] == 5 and a["gen_ai.request.seed"] == 11 and a["gen_ai.request.stream"]
        assert list(a["gen_ai.request.stop_sequences"]) == ["\n"] and a["gen_ai.response.id"] == "rid-1"
        assert a["gen_ai.usage.input_tokens"] == 4 and a["gen_ai.usage.output_tokens"] == 2
        assert list(a["gen_ai.response.finish_reasons"]) == ["length"]
        assert "gen_ai.request.top_p" not in a and "error.type" not in a
        assert span.status.status_code == StatusCode.UNSET
        assert span.resource.attributes["triton_llm.component"] == "gateway"
    run(body())


def test_usage_and_finish_reasons_cover_every_sequence():
    def script(_):
        return [response("a", seq=0, n_in=6, n_out=3, finish="stop"),
                response("b", seq=1, n_in=6, n_out=5, finish="length", final=True)]

    async def body():
        async with traced(FakeTriton(script=script)) as (gw, stub, _, _):
            messages = pb.ChatMessages(messages=[pb.ChatMessage(role="user", content="hi")])
            await collect(stub.Generate(pb.GenerateRequest(messages=messages, max_tokens=5, num_return_sequences=2),
                                        metadata=(("traceparent", CALLER),)))
            span, = spans_of(gw)
        a = span.attributes
        assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.request.choice.count"] == 2
        assert a["gen_ai.usage.input_tokens"] == 6 and a["gen_ai.usage.output_tokens"] == 8
        assert list(a["gen_ai.response.finish_reasons"]) == ["stop", "length"]
    run(body())


def test_without_a_traceparent_the_span_roots_a_new_trace_that_triton_joins():
    async def body():
        async with traced() as (gw, stub, _, fake):
            await collect(stub.Generate(pb.GenerateRequest(prompt="x", max_tokens=2)))
            await collect(stub.Generate(pb.GenerateRequest(prompt="x", max_tokens=2)))
            spans = spans_of(gw)
        assert len(spans) == 2 and all(s.parent is None for s in spans)
        assert spans[0].context.trace_id != spans[1].context.trace_id
        for span, md in zip(spans, fake.metadata):
            forwarded = parse_traceparent(md["traceparent"])
            assert (forwarded.trace_id, forwarded.span_id) == (span.context.trace_id, span.context.span_id)
            assert "tracestate" not in md
    run(body())


def test_calls_the_sampler_leaves_out_have_no_span_and_keep_the_callers_headers():
    unsampled = f"00-{TRACE_ID}-{CALLER_SPAN}-00"

    async def body():
        async with traced(ratio=0.0) as (gw, stub, _, fake):
            await collect(stub.Generate(pb.GenerateRequest(prompt="x", max_tokens=2)))
            await collect(stub.Generate(pb.GenerateRequest(prompt="x", max_tokens=2),
                                        metadata=(("traceparent", unsampled), ("tracestate", "v=1"))))
            # a sampled caller is followed whatever the ratio (parent-based)
            await collect(stub.Generate(pb.GenerateRequest(prompt="x", max_tokens=2),
                                        metadata=(("traceparent", CALLER),)))
            spans = spans_of(gw)
        assert "traceparent" not in fake.metadata[0]
        assert fake.metadata[1]["traceparent"] == unsampled and fake.metadata[1]["tracestate"] == "v=1"
        span, = spans
        assert format(span.parent.span_id, "016x") == CALLER_SPAN
    run(body())


def test_a_ratio_samples_about_that_share_of_new_traces():
    async def body():
        async with traced(ratio=0.5) as (gw, stub, _, fake):
            for _ in range(60):
                await collect(stub.Generate(pb.GenerateRequest(prompt="x", max_tokens=2)))
            spans = spans_of(gw)
        traced_calls = [md for md in fake.metadata if "traceparent" in md]
        assert len(traced_calls) == len(spans)
        assert 15 <= len(spans) <= 45, f"{len(spans)} of 60 traced at ratio 0.5"
    run(body())


def test_errors_set_the_status_code_and_server_errors_the_span_status():
    def script(request):
        if request.id == "internal":
            return [error("in ensemble 'ensemble', something broke: secret detail")]
        return [response("a"), "hang"]

    async def body():
        async with traced(FakeTriton(script=script)) as (gw, stub, _, _):
            md = (("traceparent", CALLER),)
            internal = await failing(stub.Generate(pb.GenerateRequest(prompt="x", max_tokens=2, request_id="internal"),
                                                   metadata=md))
            invalid = await failing(stub.Generate(pb.GenerateRequest(max_tokens=2), metadata=md))   # no prompt
            deadline = await failing(stub.Generate(pb.GenerateRequest(prompt="x", max_tokens=2), metadata=md,
                                                   timeout=0.3))
            call = stub.Generate(pb.GenerateRequest(prompt="x", max_tokens=2), metadata=md)
            await call.read()
            call.cancel()
            for _ in range(250):
                if len(spans_of(gw)) == 4:
                    break
                await asyncio.sleep(0.02)
            spans = spans_of(gw)
        assert [internal.code(), invalid.code(), deadline.code()] == [
            grpc.StatusCode.INTERNAL, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.DEADLINE_EXCEEDED]
        by_code = {s.attributes["error.type"]: s for s in spans}
        assert set(by_code) == {"INTERNAL", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "CANCELLED"}
        for name, s in by_code.items():
            assert s.attributes["rpc.grpc.status_code"] == grpc.StatusCode[name].value[0]
            assert format(s.parent.span_id, "016x") == CALLER_SPAN
        # server errors are ERROR spans with the message the client got; the client's own are not
        assert by_code["INTERNAL"].status.status_code == StatusCode.ERROR
        assert by_code["INTERNAL"].status.description == f"INTERNAL: {internal.details()}"
        assert by_code["DEADLINE_EXCEEDED"].status.status_code == StatusCode.ERROR
        assert by_code["INVALID_ARGUMENT"].status.status_code == StatusCode.UNSET
        assert by_code["CANCELLED"].status.status_code == StatusCode.UNSET
        assert "gen_ai.usage.output_tokens" in by_code["CANCELLED"].attributes   # what it got before the cancel
    run(body())


def test_tracing_off_makes_no_tracer_and_forwards_the_callers_headers():
    async def body():
        async with harness() as (gw, stub, _, fake):
            await collect(stub.Generate(pb.GenerateRequest(prompt="x", max_tokens=2),
                                        metadata=(("traceparent", CALLER),)))
            assert gw.service.tracing is None
        assert fake.metadata[0]["traceparent"] == CALLER
    run(body())


def test_the_otel_environment_configures_the_gateway():
    assert from_args([], env={}).tracing is None
    cfg = from_args([], env={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_SERVICE_NAME": "gw",
                             "OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.25"})
    assert (cfg.tracing.traces_url, cfg.tracing.service_name, cfg.tracing.ratio) == \
        ("http://collector:4318/v1/traces", "gw", 0.25)
    assert from_args([], env={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"}).tracing \
        is None
    with pytest.raises(ConfigError, match="OTEL_TRACES_SAMPLER"):
        from_args([], env={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_SAMPLER": "sometimes"})


def test_every_rpc_gets_a_span_and_generate_names_the_served_checkpoint(tmp_path):
    async def body():
        fake = FakeTriton(llm_parameters={"model_path": str(REPO / "models/demo-target")},
                          preprocess_parameters={"tokenizer_path": str(tmp_path / "missing")})
        async with harness(fake, tracing=settings(), span_exporter=InMemorySpanExporter(), auth_tokens=("tok",)) \
                as (gw, stub, _, _):
            md = (("traceparent", CALLER), ("authorization", "Bearer tok"))
            await collect(stub.Generate(pb.GenerateRequest(prompt="x", max_tokens=2), metadata=md))
            await stub.GetModelInfo(pb.GetModelInfoRequest(), metadata=md)
            with pytest.raises(grpc.aio.AioRpcError):
                await stub.Tokenize(pb.TokenizeRequest(text="x"), metadata=md)
            unauthenticated = await failing(stub.Generate(pb.GenerateRequest(prompt="x", max_tokens=2),
                                                          metadata=(("traceparent", CALLER),)))
            spans = {(s.name, s.attributes.get("error.type")): s for s in spans_of(gw)}
        assert unauthenticated.code() == grpc.StatusCode.UNAUTHENTICATED
        assert set(spans) == {(GENERATE, None), ("triton_llm.v1.LLMService/GetModelInfo", None),
                              ("triton_llm.v1.LLMService/Tokenize", "FAILED_PRECONDITION"),
                              (GENERATE, "UNAUTHENTICATED")}
        assert spans[GENERATE, None].attributes["gen_ai.request.model"] == "demo-target"
        assert all(s.kind == SpanKind.SERVER and format(s.parent.span_id, "016x") == CALLER_SPAN
                   for s in spans.values())
        assert spans["triton_llm.v1.LLMService/Tokenize", "FAILED_PRECONDITION"].attributes["rpc.method"] == "Tokenize"
    run(body())


def test_a_hanging_collector_delays_neither_calls_nor_shutdown():
    import socket
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    held = []
    threading.Thread(target=lambda: held.append(listener.accept()), daemon=True).start()   # and never answers
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/v1/traces"

    async def body():
        tracing = TracingSettings(url, schedule_delay_ms=10, export_timeout_s=30.0)   # an export that would hang
        async with harness(tracing=tracing) as (_, stub, _, _):
            t0 = time.monotonic()
            for _ in range(3):
                out = await collect(stub.Generate(pb.GenerateRequest(prompt="x", max_tokens=2),
                                                  metadata=(("traceparent", CALLER),)))
                assert "".join(m.text for m in out) == "hello world"
            assert time.monotonic() - t0 < 5
            await asyncio.sleep(0.2)           # the exporter is now stuck in its first export
            t0 = time.monotonic()
        return time.monotonic() - t0           # the harness's exit: gw.stop(), which flushes the spans
    try:
        took = run(body())
        assert held, "the exporter never reached the collector"
        assert took < 5, f"the gateway took {took:.1f}s to stop with a hanging collector"
    finally:
        listener.close()


class _EndedContext:
    """A servicer context as the handler's exception leaves it: time left on the deadline, no abort code."""

    def __init__(self, remaining):
        self._remaining = remaining

    def time_remaining(self):
        return self._remaining

    def code(self):
        return None

    def details(self):
        return None


@pytest.mark.parametrize("remaining, want", [(-0.001, grpc.StatusCode.DEADLINE_EXCEEDED),
                                             (5.0, grpc.StatusCode.UNKNOWN), (None, grpc.StatusCode.UNKNOWN)])
def test_an_ending_without_a_code_past_the_deadline_is_the_deadlines(remaining, want):
    """The upstream call shares the deadline; when its timer fires first, the abort reporting it can find the call
    ended and leave no code: past the deadline that is DEADLINE_EXCEEDED (what the client sees), else UNKNOWN."""
    from gateway.tracing import ServerSpan
    span = ServerSpan(tracer=None, method="Generate", parent=None, context=None, start_ns=0)
    span.failed(RuntimeError("abort on an ended call"), _EndedContext(remaining))
    assert span.code == want
    assert (span.message == "deadline exceeded") == (want == grpc.StatusCode.DEADLINE_EXCEEDED)
