"""preprocess/tracing.py: a preprocess span per traced request, with chat template and tokenize children."""
from __future__ import annotations

import pytest

from preprocess.request import RequestParser
from preprocess.serving import PreprocessServing
from preprocess.tokenizer import load_tokenizer
from tests.helpers.checkpoints import DEMO_TARGET
from tests.helpers.spans import (
    TRITON_CONTEXT,
    TRITON_SPAN_ID,
    UNSAMPLED_CONTEXT,
    MemoryTracer,
    parent_id,
    span_id,
    within,
)
from tests.helpers.triton_fakes import Request, make_pb_utils
from cli.client import INPUT_TYPES, to_array


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(DEMO_TARGET)


def request(context=TRITON_CONTEXT, **values):
    r = Request({k: to_array(k, v) for k, v in values.items()}, request_id="c1")
    r.trace_context = context
    return r


@pytest.fixture
def traced(tokenizer):
    tracer = MemoryTracer("preprocess")
    return PreprocessServing(RequestParser(tokenizer), make_pb_utils(), list(INPUT_TYPES), tracer=tracer), tracer


def by_name(spans):
    out = {}
    for s in spans:
        out.setdefault(s.name, []).append(s)
    return out


def test_prompt_request_has_preprocess_and_tokenize_spans(traced, tokenizer):
    serving, tracer = traced
    resp, = serving.execute([request(text_input="def f(x):", max_tokens=4)])
    assert not resp.has_error()
    spans = by_name(tracer.finished())
    pre, = spans["preprocess"]
    tok, = spans["preprocess.tokenize"]
    assert parent_id(pre) == TRITON_SPAN_ID and parent_id(tok) == span_id(pre)
    assert within(tok, pre)
    assert pre.attributes["gen_ai.usage.input_tokens"] == len(tokenizer.encode("def f(x):"))
    assert pre.attributes["triton_llm.chat"] is False
    assert "preprocess.chat_template" not in spans


def test_chat_request_has_a_chat_template_span(traced):
    serving, tracer = traced
    resp, = serving.execute([request(text_input="", messages=[{"role": "user", "content": "hi"}], max_tokens=4)])
    assert not resp.has_error()
    spans = by_name(tracer.finished())
    pre, = spans["preprocess"]
    tmpl, = spans["preprocess.chat_template"]
    tok, = spans["preprocess.tokenize"]
    assert pre.attributes["triton_llm.chat"] is True
    assert within(tmpl, pre) and within(tok, pre) and tmpl.end_time <= tok.start_time


def test_invalid_request_span_has_error_status(traced):
    serving, tracer = traced
    resp, = serving.execute([request(text_input="x", max_tokens=4, top_p=2.0)])
    assert resp.has_error()
    pre, = tracer.finished()
    assert pre.status.status_code.name == "ERROR" and pre.status.description.startswith("top_p")


def test_untraced_requests_make_no_spans_and_batches_are_per_request(traced):
    serving, tracer = traced
    serving.execute([request(None, text_input="a", max_tokens=2), request(UNSAMPLED_CONTEXT, text_input="b", max_tokens=2),
                     request(text_input="c", max_tokens=2)])
    spans = by_name(tracer.finished())
    assert len(spans["preprocess"]) == 1 and len(spans["preprocess.tokenize"]) == 1


def test_without_a_tracer_the_span_context_is_never_read(tokenizer):
    serving = PreprocessServing(RequestParser(tokenizer), make_pb_utils(), list(INPUT_TYPES))
    r = request(text_input="def", max_tokens=2)
    serving.execute([r])
    assert serving.tracing is None and r.trace_reads == 0
