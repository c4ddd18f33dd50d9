"""postprocess/serving.py: the Triton glue around the postprocessor, with the demo tokenizer and fake Triton objects."""
from __future__ import annotations

import json

import numpy as np
import pytest

from contracts import wire
from postprocess.processor import Postprocessor
from postprocess.serving import PostprocessServing
from preprocess.tokenizer import load_tokenizer
from tests.helpers.checkpoints import DEMO_TARGET
from tests.helpers.triton_fakes import InferenceResponse, Request, Tensor, make_pb_utils
from cli.client import to_array


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(DEMO_TARGET)


def triton_inputs(**values):
    return {k: to_array(k, v) for k, v in values.items()}


def llm_response(rid, ids, *, lps=None, **meta):
    m = wire.LLMResponseMeta(request_id=rid, **meta)
    return Request({wire.OUTPUT_IDS: np.asarray([ids], dtype=np.int32),
                    wire.OUTPUT_LOG_PROBS: np.asarray([lps or []], dtype=np.float32),
                    wire.RESPONSE: np.asarray([[m.to_json().encode()]], dtype=object)})


def options(**kw) -> str:
    base = {"v": 1, "exclude_input_in_output": True, "stream": True}
    base.update(kw)
    return json.dumps(base)


@pytest.fixture
def post(tokenizer):
    def ack(kwargs):
        return [InferenceResponse([Tensor(wire.RESPONSE, np.asarray([[b"{}"]], dtype=object))])]
    pb = make_pb_utils(bls_responder=ack)
    return PostprocessServing(Postprocessor(tokenizer), pb), pb


def text_of(resp) -> str:
    return resp.tensor("text_output").reshape(-1)[0].decode()


def reason_of(resp) -> str:
    return resp.tensor("finish_reason").reshape(-1)[0].decode()


def test_postprocess_deltas_join_to_the_decoded_text(post, tokenizer):
    serving, pb = post
    ids = tokenizer.encode("def fibonacci(n):\n    return n", add_special_tokens=False)
    reqs = [llm_response("e1", [t], options=options() if i == 0 else None, finished=i == len(ids) - 1,
                         request_finished=i == len(ids) - 1, finish_reason="length" if i == len(ids) - 1 else None,
                         num_output_tokens=i + 1)
            for i, t in enumerate(ids)]
    outs = serving.execute(reqs)
    assert "".join(text_of(o) for o in outs) == tokenizer.decode(ids)
    assert [reason_of(o) for o in outs][-1] == "length" and all(reason_of(o) == "" for o in outs[:-1])
    assert pb.bls_calls == [] and len(serving.processor.table) == 0


def test_postprocess_stop_string_stops_the_engine_once(post, tokenizer):
    serving, pb = post
    ids = tokenizer.encode("a = 1\nb = 2\nc = 3", add_special_tokens=False)
    outs = [serving.process(llm_response("e2", [t], options=options(stop=["b ="]) if i == 0 else None))
            for i, t in enumerate(ids)]
    final = serving.process(llm_response("e2", [], finished=True, request_finished=True, finish_reason="abort"))
    assert "".join(text_of(o) for o in outs + [final]) == "a = 1\n"
    (kwargs, decoupled), = pb.bls_calls
    assert decoupled and kwargs["model_name"] == "llm" and kwargs["request_id"] == "e2"
    stop_tensor, reason_tensor = kwargs["inputs"]
    assert stop_tensor.name() == wire.STOP and stop_tensor.as_numpy().reshape(-1).tolist() == [True]
    assert reason_tensor.name() == wire.REQUEST
    assert wire.parse_stop_reason(reason_tensor.as_numpy().reshape(-1)[0]) == "stop_string"
    assert reason_of(final) == "stop"


def test_postprocess_error_meta_becomes_triton_error_and_drops_state(post):
    serving, _ = post
    serving.process(llm_response("e3", [5], options=options()))
    resp = serving.process(llm_response("e3", [], finished=True, request_finished=True, finish_reason="error",
                                        error="max_tokens: prompt (3 tokens) + max_tokens (9999) exceeds max_model_len"))
    assert resp.has_error() and resp.error().message().startswith("max_tokens:")
    assert len(serving.processor.table) == 0


def test_postprocess_error_of_one_sequence_is_reported_on_the_final_response(post):
    serving, _ = post
    serving.process(llm_response("e8", [5], options=options(n=2), seq_index=0))
    mid = serving.process(llm_response("e8", [], seq_index=0, finished=True, finish_reason="error", error="boom"))
    assert not mid.has_error() and text_of(mid) == ""
    final = serving.process(llm_response("e8", [], seq_index=1, finished=True, request_finished=True,
                                         finish_reason="error", error="boom"))
    assert final.has_error() and final.error().message() == "boom"


def test_postprocess_cancelled_request_stops_the_engine(tokenizer):
    now = [0.0]
    pb = make_pb_utils()
    serving = PostprocessServing(Postprocessor(tokenizer), pb, cancel_check_interval_s=0.05, clock=lambda: now[0])
    r = llm_response("e4", [5], options=options())
    r.cancelled = True
    serving.process(r)        # the first response is not asked (it would delay the first token)
    assert pb.bls_calls == []
    for ids in ([6], [7]):
        now[0] += 0.06
        r = llm_response("e4", ids)
        r.cancelled = True
        serving.process(r)
    assert [k["request_id"] for k, _ in pb.bls_calls] == ["e4"]   # stopped once
    reason = pb.bls_calls[0][0]["inputs"][1].as_numpy().reshape(-1)[0]
    assert wire.parse_stop_reason(reason) == "cancelled"


class CountedCancel(Request):
    """A request whose ``is_cancelled()`` calls are counted (in ``calls``) and answer False."""

    def __init__(self, request: Request, calls: list):
        super().__init__({})
        self.inputs, self.calls = request.inputs, calls

    def is_cancelled(self):
        self.calls.append(1)
        return False


def test_postprocess_asks_is_cancelled_at_most_every_interval_and_never_on_the_final(tokenizer):
    now = [0.0]
    calls = []
    serving = PostprocessServing(Postprocessor(tokenizer), make_pb_utils(), cancel_check_interval_s=0.05,
                                 clock=lambda: now[0])
    serving.process(CountedCancel(llm_response("e7", [5], options=options()), calls))
    for k in range(10):
        now[0] += 0.02
        serving.process(CountedCancel(llm_response("e7", [6]), calls))
    assert len(calls) == 3  # at t = 0.06, 0.12, 0.18 (not at the first response, t = 0)
    now[0] += 1.0
    serving.process(CountedCancel(llm_response("e7", [], finished=True, request_finished=True,
                                               finish_reason="length"), calls))
    assert len(calls) == 3 and "e7" not in serving._cancel_checked


def test_postprocess_rations_is_cancelled_across_many_streams(tokenizer):
    now = [0.0]
    calls = []
    serving = PostprocessServing(Postprocessor(tokenizer), make_pb_utils(), cancel_check_interval_s=0.05,
                                 cancel_checks_per_s=50.0, clock=lambda: now[0])
    streams = [f"m{i}" for i in range(32)]
    for rid in streams:
        serving.process(CountedCancel(llm_response(rid, [5], options=options()), calls))
    for _ in range(50):   # one response per stream every 0.1 s, for 5 s
        now[0] += 0.1
        for rid in streams:
            serving.process(CountedCancel(llm_response(rid, [6]), calls))
    # 32 streams at 50 checks/s: each asked every 32 / 50 = 0.64 s (not every 0.1 s): ~7 times in 5 s
    assert 32 * 6 <= len(calls) <= 32 * 8
    with pytest.raises(ValueError, match="cancel_checks_per_s"):
        PostprocessServing(Postprocessor(tokenizer), make_pb_utils(), cancel_checks_per_s=0)


def test_postprocess_stop_ack_is_an_empty_response(post):
    serving, pb = post
    resp = serving.process(llm_response("client-id", [], finished=True, request_finished=True, stop_ack=True))
    assert not resp.has_error() and text_of(resp) == "" and pb.bls_calls == []


def test_postprocess_logprobs_and_counts(post, tokenizer):
    serving, _ = post
    ids = tokenizer.encode("x = 1", add_special_tokens=False)
    resp = serving.process(llm_response("e5", ids, lps=[-0.5] * len(ids), cum_logprob=-0.5 * len(ids),
                                        options=options(return_log_probs=True, num_input_tokens=3, stream=False),
                                        finished=True, request_finished=True, finish_reason="length"))
    assert resp.tensor("output_log_probs").reshape(-1).tolist() == [-0.5] * len(ids)
    assert resp.tensor("cum_log_probs").reshape(-1)[0] == pytest.approx(-0.5 * len(ids))
    assert resp.tensor("num_input_tokens").reshape(-1)[0] == 3
    assert resp.tensor("num_output_tokens").reshape(-1)[0] == len(ids)


def test_postprocess_top_logprobs_name_each_alternative_and_stop_with_the_text(post, tokenizer):
    serving, _ = post
    ids = tokenizer.encode("x = 1", add_special_tokens=False)
    tops = [[[t, -0.1], [ids[0], -2.5]] for t in ids]
    resp = serving.process(llm_response("e7", ids, lps=[-0.1] * len(ids), top_logprobs=tops,
                                        options=options(return_log_probs=True, stop=["="]),
                                        finished=True, request_finished=True, finish_reason="length"))
    got = json.loads(resp.tensor("top_log_probs").reshape(-1)[0])
    kept = len(resp.tensor("output_log_probs").reshape(-1))
    assert 0 < kept < len(ids) and len(got) == kept        # cut with the text at the stop string
    assert got[0] == [{"token_id": ids[0], "token": tokenizer.decode([ids[0]], skip_special_tokens=False),
                       "logprob": pytest.approx(-0.1)},
                      {"token_id": ids[0], "token": tokenizer.decode([ids[0]], skip_special_tokens=False),
                       "logprob": pytest.approx(-2.5)}]
    plain = serving.process(llm_response("e8", ids, lps=[-0.1] * len(ids), options=options(return_log_probs=True),
                                         finished=True, request_finished=True, finish_reason="length"))
    assert plain.tensor("top_log_probs").reshape(-1)[0] == b""


def test_postprocess_internal_failure_midstream_is_reported_on_the_final_response(post, monkeypatch):
    serving, pb = post
    serving.process(llm_response("e6", [5], options=options()))

    def boom(*a, **k):
        raise RuntimeError("detokenizer exploded")
    monkeypatch.setattr(serving.processor, "process", boom)
    mid = serving.process(llm_response("e6", [6]))
    assert not mid.has_error() and text_of(mid) == ""
    assert [k["request_id"] for k, _ in pb.bls_calls] == ["e6"]
    final = serving.process(llm_response("e6", [], finished=True, request_finished=True, finish_reason="abort"))
    assert final.has_error() and "detokenizer exploded" in final.error().message()


def test_a_guided_output_failing_its_guide_is_an_error_and_counted(post, tokenizer):
    serving, pb = post
    ids = tokenizer.encode('{"a": 1', add_special_tokens=False) + [1]
    good = tokenizer.encode('{"a": 1}', add_special_tokens=False) + [1]
    opts = options(guide_type="json")
    ok = serving.process(llm_response("g1", good, options=opts, finished=True, request_finished=True,
                                      finish_reason="stop"))
    assert not ok.has_error() and text_of(ok) == '{"a": 1}'
    bad = serving.process(llm_response("g2", ids, options=opts, finished=True, request_finished=True,
                                       finish_reason="stop"))
    assert bad.has_error() and bad.error().message().startswith("guided_decoding_guide: internal error")
    counter = next(f for f in pb.families if f.name == "triton_llm_guided_output_invalid_total")
    assert counter.kind == "counter" and counter.metrics[0].value == 1
    cut = serving.process(llm_response("g3", ids[:-1], options=opts, finished=True, request_finished=True,
                                       finish_reason="length"))
    assert not cut.has_error() and reason_of(cut) == "length" and counter.metrics[0].value == 1
