"""tracing/: the OTEL_* environment, tritonserver's trace flags, spans under Triton's context,
and an exporter that stays bounded when the collector is down or hangs."""
from __future__ import annotations

import socket
import threading
import time

import pytest
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tracing import (
    ModelTracer,
    TracingConfigError,
    TracingSettings,
    format_traceparent,
    parse_resource_attributes,
    parse_traceparent,
    ratio_samples,
    trace_id_of,
)

TRACE = "0af7651916cd43dd8448eb211c80319c"
PARENT = "b7ad6b7169203331"
CONTEXT = '{"traceparent":"00-%s-%s-01"}' % (TRACE, PARENT)


# ---- settings from the environment ---------------------------------------------------------------

def test_no_endpoint_means_no_tracing():
    assert TracingSettings.from_env({}) is None
    assert TracingSettings.from_env({"OTEL_SERVICE_NAME": "x"}) is None
    assert ModelTracer.from_env("llm", {}) is None


def test_endpoint_variants():
    s = TracingSettings.from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://jaeger:4318/"})
    assert s.traces_url == "http://jaeger:4318/v1/traces" and s.service_name == "triton-llm"
    s = TracingSettings.from_env({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:9/custom/path",
                                  "OTEL_EXPORTER_OTLP_ENDPOINT": "http://ignored:4318"})
    assert s.traces_url == "http://c:9/custom/path"
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}
    assert TracingSettings.from_env({**env, "OTEL_SDK_DISABLED": "true"}) is None
    assert TracingSettings.from_env({**env, "OTEL_TRACES_EXPORTER": "none"}) is None
    with pytest.raises(TracingConfigError, match="^OTEL_TRACES_EXPORTER"):
        TracingSettings.from_env({**env, "OTEL_TRACES_EXPORTER": "zipkin"})
    with pytest.raises(TracingConfigError, match="^OTEL_EXPORTER_OTLP_PROTOCOL"):
        TracingSettings.from_env({**env, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
    with pytest.raises(TracingConfigError, match="^OTEL_EXPORTER_OTLP_ENDPOINT"):
        TracingSettings.from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "jaeger:4318"})
    s = TracingSettings.from_env({**env, "OTEL_SERVICE_NAME": "chat", "OTEL_EXPORTER_OTLP_TIMEOUT": "1500",
                                  "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=prod,team=ml"})
    assert s.service_name == "chat" and s.export_timeout_s == 1.5
    assert s.resource_attributes == (("deployment.environment", "prod"), ("team", "ml"))


def test_batch_span_processor_settings_from_the_environment_reach_triton_too():
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}
    s = TracingSettings.from_env(env)
    assert (s.max_queue_size, s.max_export_batch_size, s.schedule_delay_ms) == (2048, 512, 5000)   # the spec's
    s = TracingSettings.from_env({**env, "OTEL_BSP_SCHEDULE_DELAY": "250", "OTEL_BSP_MAX_QUEUE_SIZE": "100",
                                  "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "50"})
    assert (s.max_queue_size, s.max_export_batch_size, s.schedule_delay_ms) == (100, 50, 250)
    args = s.triton_args()
    for flag in ("opentelemetry,bsp_schedule_delay=250", "opentelemetry,bsp_max_queue_size=100",
                 "opentelemetry,bsp_max_export_batch_size=50"):
        assert flag in args
    tracer = ModelTracer(s, "llm", exporter=InMemorySpanExporter())
    assert (tracer.processor._batch_processor._schedule_delay, tracer.processor._batch_processor._max_queue_size,
            tracer.processor._batch_processor._max_export_batch_size) == (0.25, 100, 50)
    tracer.shutdown()
    for var, value in (("OTEL_BSP_SCHEDULE_DELAY", "soon"), ("OTEL_BSP_MAX_QUEUE_SIZE", "0"),
                       ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "4096")):
        with pytest.raises(TracingConfigError, match="^" + var):
            TracingSettings.from_env({**env, var: value})


@pytest.mark.parametrize("sampler,arg,ratio,rate", [
    ("", "", 1.0, 1), ("always_on", "", 1.0, 1), ("parentbased_always_on", "", 1.0, 1),
    ("traceidratio", "0.25", 0.25, 4), ("parentbased_traceidratio", "0.1", 0.1, 10),
    ("traceidratio", "0.3", 0.3, 3), ("traceidratio", "", 1.0, 1),
    ("always_off", "", 0.0, None), ("parentbased_always_off", "", 0.0, None), ("traceidratio", "0", 0.0, None),
])
def test_sampler_maps_onto_tritons_rate(sampler, arg, ratio, rate):
    s = TracingSettings.from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_SAMPLER": sampler,
                                  "OTEL_TRACES_SAMPLER_ARG": arg})
    assert s.ratio == ratio and s.triton_rate == rate
    args = s.triton_args()
    assert args[::2] == ["--trace-config"] * (len(args) // 2)
    flags = args[1::2]
    assert "mode=opentelemetry" in flags and "opentelemetry,url=http://c:4318/v1/traces" in flags
    assert f"rate={rate or 1}" in flags
    assert ("level=TIMESTAMPS" if rate else "level=OFF") in flags
    assert "opentelemetry,resource=service.name=triton-llm" in flags


@pytest.mark.parametrize("sampler,arg,var", [("probabilistic", "", "OTEL_TRACES_SAMPLER"),
                                             ("traceidratio", "1.5", "OTEL_TRACES_SAMPLER_ARG"),
                                             ("traceidratio", "half", "OTEL_TRACES_SAMPLER_ARG")])
def test_bad_sampler_names_the_variable(sampler, arg, var):
    with pytest.raises(TracingConfigError, match=f"^{var}:"):
        TracingSettings.from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_SAMPLER": sampler,
                                  "OTEL_TRACES_SAMPLER_ARG": arg})


def test_resource_attributes_go_to_triton_too():
    s = TracingSettings.from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
                                  "OTEL_RESOURCE_ATTRIBUTES": "a=1,broken,service.name=dup"})
    assert parse_resource_attributes("a=1,broken,service.name=dup") == (("a", "1"), ("service.name", "dup"))
    flags = s.triton_args()[1::2]
    assert "opentelemetry,resource=a=1" in flags
    assert "opentelemetry,resource=service.name=dup" not in flags   # OTEL_SERVICE_NAME's job


def test_trace_id_of_tritons_context():
    assert trace_id_of(CONTEXT) == TRACE
    assert trace_id_of({"traceparent": f"00-{TRACE}-{PARENT}-01"}) == TRACE
    assert trace_id_of(None) is None and trace_id_of("") is None and trace_id_of("not json") is None


# ---- spans --------------------------------------------------------------------------------------

def make_tracer(exporter=None, **settings):
    s = TracingSettings("http://unused:1/v1/traces", schedule_delay_ms=10, **settings)
    return ModelTracer(s, "llm", exporter=exporter or InMemorySpanExporter())


def test_spans_are_children_of_tritons_span_with_explicit_times():
    exporter = InMemorySpanExporter()
    tracer = make_tracer(exporter)
    parent = tracer.parent(CONTEXT)
    assert parent is not None
    ctx = tracer.span("llm.generate", parent, 1_000, 9_000, {"gen_ai.request.max_tokens": 8, "skip": None},
                      events=[("first_token", 3_000, {"n": 1})])
    tracer.span("llm.decode", ctx, 3_000, 9_000, {"tokens": (1, 2)})
    tracer.shutdown()
    spans = {s.name: s for s in exporter.get_finished_spans()}
    gen, dec = spans["llm.generate"], spans["llm.decode"]
    assert format(gen.context.trace_id, "032x") == TRACE
    assert format(gen.parent.span_id, "016x") == PARENT
    assert dec.parent.span_id == gen.context.span_id and dec.context.trace_id == gen.context.trace_id
    assert (gen.start_time, gen.end_time) == (1_000, 9_000)
    assert dict(gen.attributes) == {"gen_ai.request.max_tokens": 8}
    assert list(dec.attributes["tokens"]) == [1, 2]
    assert [(e.name, e.timestamp) for e in gen.events] == [("first_token", 3_000)]
    assert gen.resource.attributes["service.name"] == "triton-llm"
    assert gen.resource.attributes["triton.model_name"] == "llm"


def test_no_spans_without_a_sampled_parent():
    exporter = InMemorySpanExporter()
    tracer = make_tracer(exporter)
    assert tracer.parent(None) is None
    assert tracer.parent('{"traceparent":"00-%s-%s-00"}' % (TRACE, PARENT)) is None   # not sampled by Triton
    assert tracer.parent('{"traceparent":"garbage"}') is None
    tracer.span("orphan", None, 1, 2)        # the parent-based sampler never starts a trace of its own
    tracer.shutdown()
    assert exporter.get_finished_spans() == ()


ZERO_TRACE, ZERO_SPAN = "0" * 32, "0" * 16


@pytest.mark.parametrize("header, parsed", [
    (f"00-{TRACE}-{PARENT}-01", (int(TRACE, 16), int(PARENT, 16), True)),
    (f" 00-{TRACE}-{PARENT}-00 ", (int(TRACE, 16), int(PARENT, 16), False)),
    (f"01-{TRACE}-{PARENT}-03-future", (int(TRACE, 16), int(PARENT, 16), True)),   # a later version
    (f"00-{TRACE}-{PARENT}-01-extra", None),    # version 00 has exactly four fields
    (f"ff-{TRACE}-{PARENT}-01", None), (f"00-{ZERO_TRACE}-{PARENT}-01", None),
    (f"00-{TRACE}-{ZERO_SPAN}-01", None), (f"00-{TRACE[:-1]}-{PARENT}-01", None),
    (f"00-{TRACE}-{PARENT}-zz", None), ("", None), (None, None), ("garbage", None)])
def test_traceparent_parsing(header, parsed):
    got = parse_traceparent(header)
    assert (got if got is None else (got.trace_id, got.span_id, got.sampled)) == parsed


def test_traceparent_round_trip_and_new_contexts():
    assert format_traceparent(int(TRACE, 16), int(PARENT, 16)) == f"00-{TRACE}-{PARENT}-01"
    tracer = make_tracer()
    parent = tracer.parent(CONTEXT)
    child, root = tracer.new_context(parent), tracer.new_context()
    assert child.trace_id == parent.trace_id and child.span_id not in (0, parent.span_id) and child.trace_flags.sampled
    assert root.trace_id not in (0, parent.trace_id) and root.trace_flags.sampled
    tracer.shutdown()


def test_a_span_with_its_own_context_may_be_a_root():
    exporter = InMemorySpanExporter()
    tracer = make_tracer(exporter)
    ctx = tracer.new_context()
    assert tracer.span("server", None, 1, 2, kind="SERVER", context=ctx) == ctx
    tracer.shutdown()
    span, = exporter.get_finished_spans()
    assert span.parent is None and span.context.span_id == ctx.span_id and span.kind.name == "SERVER"


def test_ratio_sampling_of_new_traces_by_trace_id():
    assert ratio_samples(2**64 - 1, 1.0) and not ratio_samples(0, 0.0)
    low = 1 << 62                                   # low 64 bits: a quarter of the range
    assert ratio_samples(low - 1, 0.25) and not ratio_samples(low, 0.25)
    assert ratio_samples((123 << 64) | (low - 1), 0.25)   # the high 64 bits do not count


class _HangingExporter:
    """An exporter stuck in export() until released (a collector that never answers)."""

    def __init__(self):
        self.release = threading.Event()
        self.calls = 0

    def export(self, spans):
        self.calls += 1
        self.release.wait(30)
        return SpanExportResult.FAILURE

    def shutdown(self):
        self.release.set()

    def force_flush(self, timeout_millis=30000):
        return True


def test_queue_is_bounded_and_span_creation_never_waits_on_the_exporter():
    exporter = _HangingExporter()
    tracer = make_tracer(exporter, max_queue_size=64, max_export_batch_size=16)
    parent = tracer.parent(CONTEXT)
    t0 = time.perf_counter()
    for i in range(2_000):
        tracer.span("s", parent, i, i + 1)
    elapsed = time.perf_counter() - t0
    queue = tracer.processor._batch_processor._queue
    assert len(queue) <= 64 and queue.maxlen == 64
    assert elapsed < 5.0, f"2000 spans took {elapsed:.2f}s with the exporter stuck"
    t0 = time.perf_counter()
    tracer.shutdown(timeout_s=0.5)
    assert time.perf_counter() - t0 < 3.0
    exporter.release.set()


def _silent_server():
    """A TCP server that accepts connections and never answers."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    conns = []

    def accept():
        while True:
            try:
                conns.append(srv.accept()[0])
            except OSError:
                return
    threading.Thread(target=accept, daemon=True).start()
    return srv, conns


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.mark.parametrize("kind", ["hangs", "refuses"])
def test_real_exporter_gives_up_within_its_timeout(kind):
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    if kind == "hangs":
        srv, conns = _silent_server()
        port = srv.getsockname()[1]
    else:
        port = _closed_port()
    settings = TracingSettings(f"http://127.0.0.1:{port}/v1/traces", export_timeout_s=1.0, schedule_delay_ms=10)
    exporter = OTLPSpanExporter(endpoint=settings.traces_url, timeout=settings.export_timeout_s)
    tracer = ModelTracer(settings, "llm", exporter=exporter)
    tracer.span("s", tracer.parent(CONTEXT), 1, 2)
    t0 = time.perf_counter()
    ok = exporter.export([])   # one export, retries included
    took = time.perf_counter() - t0
    assert not ok.name == "SUCCESS"
    assert took < settings.export_timeout_s + 1.0, f"export took {took:.2f}s against a server that {kind}"
    t0 = time.perf_counter()
    tracer.shutdown(timeout_s=1.0)
    assert time.perf_counter() - t0 < 3.0
    if kind == "hangs":
        srv.close()
        for c in conns:
            c.close()
