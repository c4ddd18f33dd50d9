"""The llm model's per-request telemetry: what reaches the sinks (backend/serving/llm_serving.py),
the JSON log line (request_log.py), the background thread (telemetry.py) and the spans (tracing.py)."""
from __future__ import annotations

import io
import json
import logging
import threading
import time

import numpy as np
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from backend.core.outputs import FinishReason
from backend.core.outputs import RequestStats
from backend.serving.llm_serving import LLMServing
from backend.serving.request_log import RequestLog, log_record, parse_level, token_sha256
from backend.serving.telemetry import FinishedRequest, RequestTelemetry
from backend.serving.tracing import LLMSpans
from contracts import wire
from contracts.sampling_params import GuideSpec, SamplingParams
from tracing import ModelTracer, TracingSettings
from tests.backend.serving.test_llm_serving import FakeEngine, llm_request, stop_request
from tests.helpers.triton_fakes import Request, make_pb_utils

TRACE = "0af7651916cd43dd8448eb211c80319c"
CONTEXT = '{"traceparent":"00-%s-b7ad6b7169203331-01"}' % TRACE


def stats(**kw) -> RequestStats:
    base = dict(arrival_time=10.0, first_scheduled_time=10.5, first_token_time=11.0, finished_time=14.0,
                num_prompt_tokens=3, num_cached_tokens=0, num_output_tokens=4, num_decode_steps=3,
                num_prefill_chunks=1, num_preemptions=0, seed=77, prefill_chunks=((10.5, 11.0, 3),),
                inter_token_latencies=(1.0, 1.0, 1.0), decode_times=((3.0, 4),))
    base.update(kw)
    return RequestStats(**base)


class Capture:
    """A telemetry stand-in that keeps every submitted record."""

    def __init__(self):
        self.records: list[FinishedRequest] = []

    def submit(self, rec):
        self.records.append(rec)

    def shutdown(self):
        pass


@pytest.fixture
def traced():
    engine, pb, cap = FakeEngine(), make_pb_utils(), Capture()
    serving = LLMServing(engine, pb, cancel_poll_interval_s=0.01, telemetry=cap, tracing=True, model_name="demo")
    yield engine, serving, cap
    serving.shutdown()


def submit(serving, engine, **kw) -> tuple[str, Request]:
    r = llm_request(**kw)
    r.trace_context = CONTEXT
    serving.execute([r])
    return engine.added[-1][0], r


# ---- llm serving -> telemetry ------------------------------------------------------------------

def test_finished_request_reaches_telemetry_with_hashes_and_stats(traced):
    engine, serving, cap = traced
    rid, r = submit(serving, engine, options='{"stop":["x"],"prompt_token_ids":[5,6,7]}', request_id="client-1",
                    max_tokens=4, temperature=0.8)
    engine.emit(rid, [10])
    engine.emit(rid, [11, 12])
    assert cap.records == []
    engine.emit(rid, [13], True, True, FinishReason.LENGTH, stats=stats())
    rec, = cap.records
    assert rec.engine_id == rid and rec.client_id == "client-1" and rec.model_name == "demo"
    assert rec.prompt_sha256 == token_sha256([5, 6, 7]) and rec.num_prompt_tokens == 3
    assert rec.output_sha256 == [token_sha256([10, 11, 12, 13])]
    assert rec.finish_reason == "length" and rec.finish_reasons == ["length"] and rec.stopped_by is None
    assert rec.params.temperature == 0.8 and rec.stats.seed == 77
    assert rec.trace_context == CONTEXT and rec.trace_id == TRACE and r.trace_reads == 1


def test_stop_string_stop_is_logged_as_stop(traced):
    engine, serving, cap = traced
    rid, _ = submit(serving, engine)
    stop = stop_request(rid)
    stop.inputs[wire.REQUEST] = type(stop.inputs[wire.STOP])(
        wire.REQUEST, np.asarray([[wire.stop_reason_json("stop_string").encode()]], dtype=object))
    serving.execute([stop])
    engine.emit(rid, [9], True, True, FinishReason.ABORT, stats=stats(num_output_tokens=1))
    rec, = cap.records
    assert rec.stopped_by == "stop_string" and rec.finish_reason == "stop" and rec.finish_reasons == ["stop"]


@pytest.mark.parametrize("reason,stopped_by,seen", [("cancelled", "cancelled", "abort"), ("error", "error", "error"),
                                                    (None, "stop_request", "abort")])
def test_other_stops_keep_their_reason(traced, reason, stopped_by, seen):
    engine, serving, cap = traced
    rid, _ = submit(serving, engine, request_id="c9")
    stop = stop_request(rid if reason else "c9")       # a client's own stop names its request id
    if reason:
        stop.inputs[wire.REQUEST] = type(stop.inputs[wire.STOP])(
            wire.REQUEST, np.asarray([[wire.stop_reason_json(reason).encode()]], dtype=object))
    serving.execute([stop])
    engine.emit(rid, [], True, True, FinishReason.ABORT, stats=stats(num_output_tokens=0))
    rec, = cap.records
    assert rec.stopped_by == stopped_by and rec.finish_reason == seen


def test_cancel_watcher_marks_cancelled(traced):
    engine, serving, cap = traced
    rid, r = submit(serving, engine)
    r.cancelled = True
    deadline = time.monotonic() + 5
    while not engine.aborted and time.monotonic() < deadline:
        time.sleep(0.01)
    engine.emit(rid, [], True, True, FinishReason.ABORT, stats=stats())
    assert cap.records[0].stopped_by == "cancelled" and cap.records[0].finish_reason == "abort"


def test_parallel_samples_hash_each_sequence(traced):
    engine, serving, cap = traced
    rid, _ = submit(serving, engine, n=2, temperature=1.0)
    engine.emit(rid, [1], seq=0)
    engine.emit(rid, [2], seq=1)
    engine.emit(rid, [3], True, False, FinishReason.STOP, seq=1)
    engine.emit(rid, [4], True, True, FinishReason.LENGTH, seq=0, stats=stats())
    rec, = cap.records
    assert rec.output_sha256 == [token_sha256([1, 4]), token_sha256([2, 3])]
    assert rec.finish_reasons == ["length", "stop"]


def test_a_request_the_engine_rejects_is_recorded_as_an_error():
    engine, pb, cap = FakeEngine(reject="max_tokens: prompt (3 tokens) + max_tokens (9999) exceeds max_model_len"), \
        make_pb_utils(), Capture()
    serving = LLMServing(engine, pb, telemetry=cap)
    r = llm_request(request_id="big")
    serving.execute([r])
    serving.shutdown()
    rec, = cap.records
    assert rec.client_id == "big" and rec.finish_reason == "error" and rec.stats is None
    assert rec.error.startswith("max_tokens:") and r.sender.sent[-1][1] == 1


def test_without_telemetry_nothing_is_hashed_or_read():
    engine, pb = FakeEngine(), make_pb_utils()
    serving = LLMServing(engine, pb)
    r = llm_request()
    r.trace_context = CONTEXT
    serving.execute([r])
    rid = engine.added[0][0]
    engine.emit(rid, [1], True, True, FinishReason.LENGTH, stats=stats())
    serving.shutdown()
    assert r.trace_reads == 0 and r.sender.sent[-1][1] == 1


def test_tracing_off_never_reads_the_span_context():
    engine, pb, cap = FakeEngine(), make_pb_utils(), Capture()
    serving = LLMServing(engine, pb, telemetry=cap, tracing=False)
    r = llm_request()
    r.trace_context = CONTEXT
    serving.execute([r])
    engine.emit(engine.added[0][0], [1], True, True, FinishReason.LENGTH, stats=stats())
    serving.shutdown()
    assert r.trace_reads == 0 and cap.records[0].trace_context is None and cap.records[0].trace_id is None


# ---- the log line ------------------------------------------------------------------------------

def record(**kw) -> FinishedRequest:
    base = dict(model_name="demo", engine_id="e1", client_id="c1",
                params=SamplingParams(max_tokens=4, temperature=0.8, top_k=40, top_p=0.9, min_p=0.05,
                                      repetition_penalty=1.1, presence_penalty=0.2, frequency_penalty=0.3,
                                      bad_words_ids=((5, 6),),   # stop_token_ids: refused beside a guide
                                      logit_bias=((9, -100.0), (12, 0.1)),
                                      guide=GuideSpec("regex", "[a-z]+")),
                stats=stats(), finish_reason="length", finish_reasons=["length"], prompt_sha256="p" * 64,
                num_prompt_tokens=3, output_sha256=["o" * 64],
                options='{"v":1,"stop":["\\n\\n"],"skip_special_tokens":true,"prompt_token_ids":[1,2,3]}',
                trace_context=CONTEXT, finished_wall=1_700_000_000.25, wall_offset=0.0)
    base.update(kw)
    return FinishedRequest(**base)


def test_log_record_holds_the_whole_sampling_tuple():
    d = log_record(record())
    assert d["request_id"] == "c1" and d["engine_request_id"] == "e1" and d["trace_id"] == TRACE
    assert d["time"] == "2023-11-14T22:13:20.250Z"
    assert d["prompt_sha256"] == "p" * 64 and d["output_sha256"] == ["o" * 64]
    assert d["prompt_tokens"] == 3 and d["output_tokens"] == 4
    assert d["sampling"] == {
        "seed": 77, "temperature": 0.8, "top_k": 40, "top_p": 0.9, "min_p": 0.05, "repetition_penalty": 1.1,
        "presence_penalty": 0.2, "frequency_penalty": 0.3, "max_tokens": 4, "min_tokens": 0, "n": 1,
        "stop_token_ids": [], "ignore_eos": False, "bad_words_ids": [[5, 6]], "logit_bias": [[9, -100.0], [12, 0.1]],
        "logprobs": None,
        "guide_type": "regex", "guide_sha256": __import__("hashlib").sha256(b"[a-z]+").hexdigest()}
    assert d["seed_drawn"] is True                      # the request had none; the engine drew 77
    assert d["output_options"] == {"stop": ["\n\n"], "skip_special_tokens": True}   # no prompt tokens
    assert d["ttft_s"] == 1.0 and d["e2e_s"] == 4.0 and d["queue_s"] == 0.5 and d["tpot_s"] == 1.0
    assert d["finish_reason"] == "length" and d["stopped_by"] is None and d["error"] is None


def test_log_record_places_the_stop_and_the_requests_last_step():
    d = log_record(record(stats=stats(last_step_time=13.5, steps_after_abort=1), finish_reason="abort",
                          stopped_by="stop_request", stopped_at=13.25, wall_offset=1_700_000_000.0))
    assert d["arrival_unix"] == 1_700_000_010.0                       # arrival_time 10.0 on the wall clock
    assert d["last_step_s"] == 3.5 and d["stop_s"] == 3.25 and d["steps_after_stop"] == 1
    d = log_record(record())                                          # never stopped
    assert d["stop_s"] is None and d["steps_after_stop"] is None and d["last_step_s"] is None
    d = log_record(record(stats=None, finish_reason="error", error="refused"))
    assert d["arrival_unix"] is None and d["last_step_s"] is None


def test_log_record_shows_fp32_inputs_as_sent():
    p = SamplingParams(max_tokens=4, temperature=float(np.float32(0.7)), top_p=float(np.float32(0.95)))
    d = log_record(record(params=p))
    assert d["sampling"]["temperature"] == 0.7 and d["sampling"]["top_p"] == 0.95
    assert np.float32(d["sampling"]["temperature"]) == np.float32(p.temperature)   # replays the same FP32 input


def test_log_record_of_a_request_the_engine_never_saw():
    d = log_record(record(stats=None, finish_reason="error", error="max_tokens: too many", trace_context=None,
                          params=SamplingParams(max_tokens=4, temperature=0.0)))
    assert d["output_tokens"] == 0 and d["ttft_s"] is None and d["trace_id"] is None
    assert d["sampling"]["seed"] is None and d["seed_drawn"] is False and d["error"] == "max_tokens: too many"


def test_request_log_writes_one_json_line_and_honours_its_level():
    buf = io.StringIO()
    RequestLog("info", stream=buf).write(record())
    line, = buf.getvalue().splitlines()
    assert json.loads(line)["engine_request_id"] == "e1"
    quiet = io.StringIO()
    RequestLog("warning", stream=quiet).write(record())
    RequestLog("off", stream=quiet).write(record())
    assert quiet.getvalue() == ""
    assert parse_level("DEBUG") == logging.DEBUG
    with pytest.raises(ValueError, match="^request_log_level:"):
        parse_level("loud")


def test_the_log_line_is_json_whatever_the_stream_encodes():
    """The stubs' stderr may be ASCII with backslashreplace (Triton's embedded interpreter under the C locale):
    a client id or error with non-ASCII text or a lone surrogate must still give a line that parses back."""
    raw = io.BytesIO()
    stream = io.TextIOWrapper(raw, encoding="ascii", errors="backslashreplace", write_through=True)
    RequestLog("info", stream=stream).write(record(client_id="caf\u00e9-\udcff", error="stop: '\u00fc' \\x"))
    line, = raw.getvalue().decode("ascii").splitlines()
    d = json.loads(line)
    assert d["request_id"] == "caf\u00e9-\udcff" and d["error"] == "stop: '\u00fc' \\x"


def test_token_sha256_is_of_int32_little_endian_bytes():
    import hashlib
    assert token_sha256([1, 258]) == hashlib.sha256(b"\x01\x00\x00\x00\x02\x01\x00\x00").hexdigest()
    assert token_sha256(np.asarray([1, 258], dtype=np.int64)) == token_sha256([1, 258])


# ---- the telemetry thread ----------------------------------------------------------------------

def test_telemetry_runs_every_sink_off_thread_and_survives_a_failing_one():
    seen, threads = [], set()

    def bad(rec):
        raise RuntimeError("boom")

    def good(rec):
        threads.add(threading.current_thread().name)
        seen.append(rec.engine_id)
    closed = []
    tel = RequestTelemetry([bad, good], closers=[lambda: closed.append(1)]).start()
    for i in range(5):
        tel.submit(record(engine_id=f"e{i}"))
    assert tel.flush(5)
    assert seen == [f"e{i}" for i in range(5)] and threads == {"llm-telemetry"}
    assert tel.processed == 5 and tel.cpu_seconds > 0
    tel.shutdown()
    assert closed == [1]


def test_periodic_work_runs_on_the_telemetry_thread_after_records_and_on_flush():
    runs = []
    tel = RequestTelemetry([lambda rec: None], periodic=[lambda: runs.append(threading.current_thread().name)],
                           period_s=0.05).start()
    time.sleep(0.2)
    assert runs == []                          # nothing finished: nothing to publish
    tel.submit(record())
    deadline = time.monotonic() + 10
    while not runs and time.monotonic() < deadline:
        time.sleep(0.01)
    assert runs == ["llm-telemetry"]           # once, period_s after the record, though no other came
    time.sleep(0.2)
    assert len(runs) == 1
    tel.submit(record())
    assert tel.flush(5) and len(runs) >= 2     # flush() publishes what is pending at once
    tel.shutdown()


def test_telemetry_queue_is_bounded():
    release = threading.Event()
    tel = RequestTelemetry([lambda rec: release.wait(10)], max_pending=3).start()
    t0 = time.perf_counter()
    for _ in range(20):
        tel.submit(record())
    assert time.perf_counter() - t0 < 1.0, "submit must never block"
    assert 16 <= tel.dropped <= 17       # 3 queued, at most 1 taken by the blocked sink
    release.set()
    tel.shutdown()


# ---- the llm spans -----------------------------------------------------------------------------

@pytest.fixture
def spans():
    def run(rec):
        """The spans LLMSpans makes for ``rec`` (a fresh tracer each time)."""
        exporter = InMemorySpanExporter()
        tracer = ModelTracer(TracingSettings("http://unused:1/v1/traces", schedule_delay_ms=10), "llm",
                             exporter=exporter)
        LLMSpans(tracer)(rec)
        assert tracer.shutdown()
        return {s.name: s for s in exporter.get_finished_spans()}
    return run


def test_llm_spans_tree_times_and_attributes(spans):
    s = spans(record(stats=stats(prefill_chunks=((10.5, 10.8, 2), (10.8, 11.0, 1)), preemption_times=(12.0,),
                                 num_preemptions=1, num_prefill_chunks=2), wall_offset=1000.0))
    gen, queue, prefill, decode = s["llm.generate"], s["llm.queue"], s["llm.prefill"], s["llm.decode"]
    assert format(gen.context.trace_id, "032x") == TRACE
    assert format(gen.parent.span_id, "016x") == "b7ad6b7169203331"
    assert {queue.parent.span_id, prefill.parent.span_id, decode.parent.span_id} == {gen.context.span_id}
    sec = 1_000_000_000
    assert (gen.start_time, gen.end_time) == (1010 * sec, 1014 * sec)
    assert (queue.start_time, queue.end_time) == (1010 * sec, int(1010.5 * sec))
    assert (prefill.start_time, prefill.end_time) == (int(1010.5 * sec), 1011 * sec)
    assert (decode.start_time, decode.end_time) == (1011 * sec, 1014 * sec)
    a = gen.attributes
    assert a["gen_ai.request.max_tokens"] == 4 and a["gen_ai.request.temperature"] == 0.8
    assert a["gen_ai.request.seed"] == 77 and a["gen_ai.usage.input_tokens"] == 3
    assert a["gen_ai.usage.output_tokens"] == 4 and list(a["gen_ai.response.finish_reasons"]) == ["length"]
    assert list(a["gen_ai.request.stop_sequences"]) == ["\n\n"] and a["gen_ai.request.model"] == "demo"
    assert a["triton_llm.request.guide_type"] == "regex"
    assert [e.name for e in gen.events] == ["first_token", "preempted"]
    assert [e.name for e in prefill.events] == ["prefill_chunk", "prefill_chunk"]
    assert [e.attributes["triton_llm.chunk.tokens"] for e in prefill.events] == [2, 1]
    assert decode.attributes["gen_ai.usage.output_tokens"] == 4 and decode.attributes["triton_llm.decode_steps"] == 3
    assert [e.name for e in decode.events] == ["preempted"]


def test_request_aborted_while_waiting_has_only_generate_and_queue(spans):
    s = spans(record(stats=stats(first_scheduled_time=None, first_token_time=None, num_output_tokens=0,
                                 inter_token_latencies=(), decode_times=(), prefill_chunks=()),
                     finish_reason="abort", stopped_by="cancelled", stopped_at=12.5))
    assert set(s) == {"llm.generate", "llm.queue"}
    event, = s["llm.generate"].events
    assert event.name == "stop_requested" and event.timestamp == 12_500_000_000


def test_untraced_request_makes_no_spans(spans):
    assert spans(record(trace_context=None)) == {}
    assert spans(record(trace_context='{"traceparent":"00-%s-b7ad6b7169203331-00"}' % TRACE)) == {}
