"""postprocess/tracing.py: one postprocess span per traced request over all of its responses."""
from __future__ import annotations

import pytest

from postprocess.processor import Postprocessor
from postprocess.serving import PostprocessServing
from tests.helpers.spans import TRITON_CONTEXT, TRITON_SPAN_ID, MemoryTracer, parent_id
from tests.helpers.triton_fakes import InferenceResponse, Tensor, make_pb_utils
from tests.postprocess.test_serving import llm_response, options, text_of, tokenizer  # noqa: F401 (fixture)


def traced_response(*args, context=TRITON_CONTEXT, **kw):
    r = llm_response(*args, **kw)
    r.trace_context = context
    return r


@pytest.fixture
def traced(tokenizer):  # noqa: F811
    import numpy as np

    from contracts import wire

    def ack(kwargs):
        return [InferenceResponse([Tensor(wire.RESPONSE, np.asarray([[b"{}"]], dtype=object))])]
    tracer = MemoryTracer("postprocess")
    return PostprocessServing(Postprocessor(tokenizer), make_pb_utils(bls_responder=ack), tracer=tracer), tracer


def test_one_span_per_request_with_stop_events(traced, tokenizer):  # noqa: F811
    serving, tracer = traced
    ids = tokenizer.encode("a = 1\nb = 2\nc = 3", add_special_tokens=False)
    reqs = [traced_response("e2", [t], options=options(stop=["b ="]) if i == 0 else None) for i, t in enumerate(ids)]
    outs = [serving.process(r) for r in reqs]
    outs.append(serving.process(traced_response("e2", [], finished=True, request_finished=True,
                                                finish_reason="abort")))
    assert "".join(text_of(o) for o in outs) == "a = 1\n"
    span, = tracer.finished()
    assert span.name == "postprocess" and parent_id(span) == TRITON_SPAN_ID
    assert span.attributes["triton_llm.responses"] == len(ids) + 1
    assert list(span.attributes["gen_ai.response.finish_reasons"]) == ["stop"]
    assert 0 < span.attributes["triton_llm.busy_seconds"] <= (span.end_time - span.start_time) / 1e9
    names = [e.name for e in span.events]
    assert names == ["stop_string_matched", "engine_stop_sent"]
    assert span.events[1].attributes["triton_llm.stop_reason"] == "stop_string"
    assert serving.tracing.num_open() == 0
    # only the first response's span context is read
    assert [r.trace_reads for r in reqs] == [1] + [0] * (len(reqs) - 1)


def test_error_final_response_marks_the_span(traced):
    serving, tracer = traced
    serving.process(traced_response("e3", [5], options=options()))
    serving.process(traced_response("e3", [], finished=True, request_finished=True, finish_reason="error",
                                    error="max_tokens: too many"))
    span, = tracer.finished()
    assert span.status.status_code.name == "ERROR" and span.status.description == "max_tokens: too many"


def test_untraced_request_makes_no_span_and_is_forgotten(traced):
    serving, tracer = traced
    serving.process(traced_response("e4", [5], options=options(), context=None))
    serving.process(traced_response("e4", [6], finished=True, request_finished=True, finish_reason="length",
                                    context=None))
    assert tracer.finished() == [] and serving.tracing.num_open() == 0


def test_open_table_is_bounded(tokenizer):  # noqa: F811
    tracer = MemoryTracer("postprocess")
    serving = PostprocessServing(Postprocessor(tokenizer), make_pb_utils(), tracer=tracer, max_remembered=4)
    for i in range(10):
        serving.process(traced_response(f"r{i}", [5], options=options()))
    assert serving.tracing.num_open() == 4


def test_without_a_tracer_the_span_context_is_never_read(tokenizer):  # noqa: F811
    serving = PostprocessServing(Postprocessor(tokenizer), make_pb_utils())
    r = traced_response("e5", [5], options=options(), finished=True, request_finished=True, finish_reason="length")
    serving.process(r)
    assert serving.tracing is None and r.trace_reads == 0
