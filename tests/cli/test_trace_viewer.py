"""cli/trace_viewer.py: OTLP/HTTP in both encodings, the receiver, and the waterfall."""
from __future__ import annotations

import gzip
import json
import time
import urllib.error
import urllib.request

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

from tracing import ModelTracer, TracingSettings
from tests.helpers.spans import TRACE_ID, TRITON_CONTEXT, TRITON_SPAN_ID, MemoryTracer
from cli.otlp import Span, decode, parse_json
from cli.trace_viewer import OTLPReceiver, render_trace, span_tree

# What tritonserver 2.51 posts (OTLP/JSON, ids as hex), trimmed from a real export.
TRITON_JSON = {"resourceSpans": [{"resource": {"attributes": [
    {"key": "service.name", "value": {"stringValue": "triton-llm"}}]},
    "scopeSpans": [{"scope": {"name": "triton-server"}, "spans": [
        {"name": "InferRequest", "spanId": "e1c80cc7406f0730", "parentSpanId": TRITON_SPAN_ID, "traceId": TRACE_ID,
         "kind": 2, "startTimeUnixNano": "1000000000", "endTimeUnixNano": "1100000000",
         "events": [{"name": "GRPC_SEND_START", "timeUnixNano": "1090000000"}]},
        {"name": "llm", "spanId": "ed8b6359d81eb6a2", "parentSpanId": "e1c80cc7406f0730", "traceId": TRACE_ID,
         "kind": 2, "startTimeUnixNano": "1010000000", "endTimeUnixNano": "1011000000",
         "attributes": [{"key": "triton.model_name", "value": {"stringValue": "llm"}},
                        {"key": "triton.model_version", "value": {"intValue": "1"}}]}]}]}]}


def test_parse_tritons_json():
    spans = parse_json(json.dumps(TRITON_JSON).encode())
    root, llm = spans
    assert root.trace_id == TRACE_ID and root.parent_id == TRITON_SPAN_ID and root.service == "triton-llm"
    assert llm.parent_id == root.span_id and llm.attributes == {"triton.model_name": "llm", "triton.model_version": 1}
    assert (llm.start_ns, llm.end_ns) == (1_010_000_000, 1_011_000_000)
    assert root.events == [("GRPC_SEND_START", 1_090_000_000, {})]


def sdk_spans():
    tracer = MemoryTracer("llm")
    ctx = tracer.span("llm.generate", tracer.parent(TRITON_CONTEXT), 1_020_000_000, 1_090_000_000,
                      {"gen_ai.usage.output_tokens": 7, "gen_ai.response.finish_reasons": ("stop",)},
                      events=[("first_token", 1_030_000_000, {})])
    tracer.span("llm.decode", ctx, 1_030_000_000, 1_090_000_000, error="boom")
    return tracer.finished()


def test_parse_the_sdks_protobuf_and_gzip():
    body = encode_spans(sdk_spans()).SerializeToString()
    for payload, encoding in ((body, ""), (gzip.compress(body), "gzip")):
        gen, dec = sorted(decode(payload, "application/x-protobuf", encoding), key=lambda s: s.start_ns)
        assert gen.trace_id == TRACE_ID and gen.parent_id == TRITON_SPAN_ID and gen.service == "triton-llm/llm"
        assert gen.attributes["gen_ai.usage.output_tokens"] == 7
        assert gen.attributes["gen_ai.response.finish_reasons"] == ["stop"]
        assert gen.events == [("first_token", 1_030_000_000, {})]
        assert dec.parent_id == gen.span_id and dec.status == "ERROR" and dec.status_message == "boom"


@pytest.fixture
def receiver():
    r = OTLPReceiver("127.0.0.1", 0).start()
    yield r
    r.stop()


def post(receiver, body, content_type, path="/v1/traces", encoding=None):
    req = urllib.request.Request(receiver.endpoint + path, data=body, method="POST",
                                 headers={"Content-Type": content_type, **({"Content-Encoding": encoding} if encoding else {})})
    with urllib.request.urlopen(req, timeout=5) as resp:
        return resp.status


def test_receiver_takes_both_encodings(receiver):
    assert post(receiver, json.dumps(TRITON_JSON).encode(), "application/json") == 200
    assert post(receiver, gzip.compress(encode_spans(sdk_spans()).SerializeToString()), "application/x-protobuf",
                encoding="gzip") == 200
    assert receiver.store.wait_for(lambda st: len(st.trace(TRACE_ID)) == 4, 5)
    with pytest.raises(urllib.error.HTTPError, match="404"):
        post(receiver, b"{}", "application/json", path="/v1/logs")
    with pytest.raises(urllib.error.HTTPError, match="400"):
        post(receiver, b"not json", "application/json")
    assert receiver.store.errors == 1


def test_the_real_exporter_reaches_the_receiver(receiver):
    settings = TracingSettings(receiver.endpoint + "/v1/traces", schedule_delay_ms=10)
    tracer = ModelTracer(settings, "postprocess",
                         exporter=OTLPSpanExporter(endpoint=settings.traces_url, timeout=settings.export_timeout_s))
    tracer.span("postprocess", tracer.parent(TRITON_CONTEXT), 1, 2)
    assert tracer.shutdown(5)
    span, = receiver.store.trace(TRACE_ID)
    assert span.name == "postprocess" and span.service == "triton-llm/postprocess"


def test_waterfall_indents_children_and_summarises_events():
    spans = parse_json(json.dumps(TRITON_JSON).encode()) + decode(encode_spans(sdk_spans()).SerializeToString(),
                                                                  "application/x-protobuf")
    # our llm.generate hangs under Triton's llm span
    spans[2].parent_id = "ed8b6359d81eb6a2"
    order = [(d, s.name) for d, s in span_tree(spans)]
    assert order == [(0, "InferRequest"), (1, "llm"), (2, "llm.generate"), (3, "llm.decode")]
    text = render_trace(spans)
    lines = text.splitlines()
    assert lines[0] == f"trace {TRACE_ID}  (4 spans, 100.0 ms)"
    assert lines[1].startswith("InferRequest ") and "GRPC_SEND_START" not in lines[1]
    assert lines[2].startswith("  llm ") and "model=llm" in lines[2]
    gen = lines[3]
    assert gen.startswith("    llm.generate") and "triton-llm/llm" in gen and "+20.0ms" in gen and "70.0ms" in gen
    assert "output_tokens=7" in gen and "finish=stop" in gen and "first_token@+30.0ms" in gen
    assert lines[4].startswith("      llm.decode") and lines[4].endswith("ERROR: boom")


def test_idle_traces_are_handed_out_once(receiver):
    post(receiver, json.dumps(TRITON_JSON).encode(), "application/json")
    assert receiver.store.pop_idle(60) == []
    time.sleep(0.05)
    done, = receiver.store.pop_idle(0.01)
    assert len(done) == 2 and receiver.store.trace_ids() == []


@pytest.mark.parametrize("env, interval_s", [({}, 1.0), ({"OTEL_BSP_SCHEDULE_DELAY": "5000"}, 5.0)])
def test_spans_of_one_trace_one_export_interval_apart_stay_one_trace(env, interval_s):
    """Unset here, the interval is the one make serve gives exporters that send to this machine (cli/serve.py)."""
    from cli.trace_viewer import TraceStore, default_idle_s

    now = [100.0]
    store = TraceStore(clock=lambda: now[0])
    idle = default_idle_s(env)
    first, second = (Span(TRACE_ID, f"{i:016x}", None, f"s{i}", "svc", 0, 1) for i in (1, 2))
    store.add([first])
    now[0] += interval_s                    # the next process's batch arrives one export interval later
    assert store.pop_idle(idle) == []
    store.add([second])
    now[0] += idle
    (trace,) = store.pop_idle(idle)
    assert [s.name for s in trace] == ["s1", "s2"]


def test_the_quiet_period_follows_the_export_interval():
    from cli.serve import local_trace_env
    from cli.trace_viewer import default_idle_s

    local = local_trace_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://localhost:4318"})["OTEL_BSP_SCHEDULE_DELAY"]
    assert default_idle_s({}) == default_idle_s({"OTEL_BSP_SCHEDULE_DELAY": local}) > int(local) / 1000
    assert default_idle_s({"OTEL_BSP_SCHEDULE_DELAY": "5000"}) > 5.0
    with pytest.raises(ValueError, match="OTEL_BSP_SCHEDULE_DELAY"):
        default_idle_s({"OTEL_BSP_SCHEDULE_DELAY": "soon"})
