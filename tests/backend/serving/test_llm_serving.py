"""backend/serving.py: the llm model's request/response logic, against a fake engine and fake Triton."""
from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest

from backend.core.outputs import FinishReason, RequestOutput, TokenLogprob
from backend.serving.llm_serving import LLMServing
from backend.serving.llm_startup import split_parameters
from contracts import wire
from contracts.sampling_params import GuideSpec, SamplingParams
from contracts.triton_config import resolve_paths
from tests.helpers.triton_fakes import Request, make_pb_utils

FINAL = 1


class FakeEngine:
    def __init__(self, reject: str | None = None):
        self.callbacks = {}
        self.added = []
        self.aborted = []
        self.reject = reject
        self.shut = False

    def add_request(self, request_id, prompt_token_ids, params, on_output):
        if self.reject:
            raise ValueError(self.reject)
        self.added.append((request_id, list(prompt_token_ids), params))
        self.callbacks[request_id] = on_output

    def abort(self, request_id):
        self.aborted.append(request_id)
        return request_id in self.callbacks

    def emit(self, rid, ids, finished=False, request_finished=False, reason=None, seq=0, **kw):
        cb = self.callbacks[rid]
        if request_finished:
            del self.callbacks[rid]
        cb(RequestOutput(rid, seq, list(ids), finished=finished, request_finished=request_finished,
                         finish_reason=reason, **kw))

    def shutdown(self):
        self.shut = True
        for rid in list(self.callbacks):
            self.emit(rid, [], True, True, FinishReason.ABORT, error="engine shut down")


def llm_request(prompt=(5, 6, 7), stream=True, options='{"v":1}', request_id="", **params):
    req = wire.LLMRequest(SamplingParams(**params), stream=stream, options=options)
    return Request({wire.INPUT_IDS: np.asarray([prompt], dtype=np.int32),
                    wire.REQUEST: np.asarray([[req.to_json().encode()]], dtype=object)}, request_id=request_id)


def stop_request(target: str):
    return Request({wire.STOP: np.asarray([[True]])}, request_id=target)


def meta_of(resp) -> wire.LLMResponseMeta:
    return wire.LLMResponseMeta.from_json(resp.tensor(wire.RESPONSE).reshape(-1)[0])


def ids_of(resp) -> list[int]:
    return resp.tensor(wire.OUTPUT_IDS).reshape(-1).tolist()


@pytest.fixture
def setup():
    engine, pb = FakeEngine(), make_pb_utils()
    serving = LLMServing(engine, pb, cancel_poll_interval_s=0.01)
    yield engine, pb, serving
    serving.shutdown()


def test_streams_each_output_and_ends_with_final(setup):
    engine, _, serving = setup
    r = llm_request(options='{"stop":["x"]}')
    serving.execute([r])
    (rid, prompt, params), = engine.added
    assert prompt == [5, 6, 7] and params.max_tokens == 16
    engine.emit(rid, [10])
    engine.emit(rid, [11, 12])
    engine.emit(rid, [13], True, True, FinishReason.LENGTH, num_prompt_tokens=3, num_output_tokens=4)
    sent = r.sender.sent
    assert [ids_of(s) for s, _ in sent] == [[10], [11, 12], [13]]
    assert [f for _, f in sent] == [0, 0, FINAL]
    metas = [meta_of(s) for s, _ in sent]
    assert metas[0].options == '{"stop":["x"]}' and metas[1].options is None
    assert metas[2].finish_reason == "length" and metas[2].request_finished and metas[2].num_output_tokens == 4
    assert all(m.request_id == rid for m in metas)
    assert serving.num_in_flight() == 0


def test_non_stream_sends_one_response_with_every_token_and_logprob(setup):
    engine, _, serving = setup
    r = llm_request(stream=False, logprobs=0)
    serving.execute([r])
    rid = engine.added[0][0]
    engine.emit(rid, [10], logprobs=[TokenLogprob(10, -0.5)])
    engine.emit(rid, [11], True, True, FinishReason.STOP, logprobs=[TokenLogprob(11, -1.5)], cum_logprob=-2.0)
    (resp, flags), = r.sender.sent
    assert flags == FINAL and ids_of(resp) == [10, 11]
    assert resp.tensor(wire.OUTPUT_LOG_PROBS).reshape(-1).tolist() == [-0.5, -1.5]
    m = meta_of(resp)
    assert m.options == '{"v":1}' and m.finish_reason == "stop" and m.cum_logprob == -2.0


def test_top_alternatives_travel_in_the_meta_streamed_and_not(setup):
    engine, _, serving = setup
    for stream in (True, False):
        r = llm_request(stream=stream, logprobs=2)
        serving.execute([r])
        rid = engine.added[-1][0]
        engine.emit(rid, [10], logprobs=[TokenLogprob(10, -0.5, [(10, -0.5), (3, -1.0)])])
        engine.emit(rid, [11], True, True, FinishReason.STOP,
                    logprobs=[TokenLogprob(11, -1.5, [(4, -0.9), (11, -1.5)])])
        tops = [t for resp, _ in r.sender.sent for t in (meta_of(resp).top_logprobs or [])]
        assert tops == [[[10, -0.5], [3, -1.0]], [[4, -0.9], [11, -1.5]]], stream
        assert len(r.sender.sent) == (2 if stream else 1)


def test_non_stream_n2_sends_each_sequence_once(setup):
    engine, _, serving = setup
    r = llm_request(stream=False, n=2, temperature=1.0)
    serving.execute([r])
    rid = engine.added[0][0]
    engine.emit(rid, [1], seq=0)
    engine.emit(rid, [2], seq=1)
    engine.emit(rid, [3], True, False, FinishReason.LENGTH, seq=1)
    engine.emit(rid, [4], True, True, FinishReason.LENGTH, seq=0)
    sent = r.sender.sent
    assert [(meta_of(s).seq_index, ids_of(s), f) for s, f in sent] == [(1, [2, 3], 0), (0, [1, 4], FINAL)]
    assert all(meta_of(s).options == '{"v":1}' for s, _ in sent)


def test_stop_request_by_engine_id_aborts_and_answers_at_once(setup):
    engine, _, serving = setup
    r = llm_request()
    serving.execute([r])
    rid = engine.added[0][0]
    stop = stop_request(rid)
    serving.execute([stop])
    assert engine.aborted == [rid]
    (ack, flags), = stop.sender.sent
    assert flags == FINAL and meta_of(ack).stop_ack and ids_of(ack) == []
    assert r.sender.sent == []  # the target ends when the engine reports the abort
    engine.emit(rid, [], True, True, FinishReason.ABORT)
    assert r.sender.sent[-1][1] == FINAL and meta_of(r.sender.sent[-1][0]).finish_reason == "abort"


def test_stop_request_by_client_id_and_unknown_id(setup):
    engine, _, serving = setup
    a, b = llm_request(request_id="client-7"), llm_request(request_id="other")
    serving.execute([a, b])
    stop = stop_request("client-7")
    serving.execute([stop])
    assert engine.aborted == [engine.added[0][0]]
    unknown = stop_request("nobody")
    serving.execute([unknown])
    assert engine.aborted == [engine.added[0][0]] and unknown.sender.sent[0][1] == FINAL


def test_stop_and_target_in_one_batch(setup):
    engine, _, serving = setup
    r = llm_request(request_id="c1")
    serving.execute([r])
    serving.execute([llm_request(request_id="c2"), stop_request("c1")])
    assert engine.aborted == [engine.added[0][0]]


def test_cancelled_request_is_aborted_by_the_watcher(setup):
    engine, _, serving = setup
    r = llm_request()
    serving.execute([r])
    rid = engine.added[0][0]
    r.cancelled = True
    deadline = time.monotonic() + 2
    while not engine.aborted and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.aborted == [rid]
    time.sleep(0.05)
    assert engine.aborted == [rid]  # once


def test_the_watcher_asks_a_bounded_number_of_requests_per_sweep_oldest_first():
    from backend.serving.cancel_watch import CANCEL_CHECKS_PER_SWEEP

    engine, pb = FakeEngine(), make_pb_utils()
    serving = LLMServing(engine, pb, cancel_poll_interval_s=3600)   # sweeps driven by hand below
    calls: list[str] = []
    try:
        requests = [llm_request() for _ in range(2 * CANCEL_CHECKS_PER_SWEEP + 3)]
        for i, r in enumerate(requests):
            r.is_cancelled = (lambda i=i: calls.append(i) or i == len(requests) - 1)
        serving.execute(requests)
        sweeps = 0
        while not engine.aborted:
            serving._sweep_cancellations()
            sweeps += 1
            assert len(calls) <= sweeps * CANCEL_CHECKS_PER_SWEEP
        assert sweeps == 3 and engine.aborted == [engine.added[-1][0]]
        n = len(requests)
        assert sorted(calls[:n]) == list(range(n))   # each asked once before any is asked again
    finally:
        serving.shutdown()


def test_engine_rejection_becomes_final_error_naming_field():
    engine, pb = FakeEngine(reject="max_tokens: prompt (3) + max_tokens (5000) exceed the context (1024)"), make_pb_utils()
    serving = LLMServing(engine, pb)
    try:
        r = llm_request()
        serving.execute([r])
        (resp, flags), = r.sender.sent
        m = meta_of(resp)
        assert flags == FINAL and m.finish_reason == "error" and m.error.startswith("max_tokens:")
        assert serving.num_in_flight() == 0
    finally:
        serving.shutdown()


@pytest.mark.parametrize("inputs, field", [
    ({wire.INPUT_IDS: np.asarray([[1]], dtype=np.int32)}, "request"),
    ({wire.REQUEST: np.asarray([[b"{}"]], dtype=object)}, "input_ids"),
    ({wire.INPUT_IDS: np.asarray([[1]], dtype=np.int32), wire.REQUEST: np.asarray([[b"{nope"]], dtype=object)},
     "request"),
    ({wire.INPUT_IDS: np.asarray([[1]], dtype=np.int32),
      wire.REQUEST: np.asarray([[b'{"sampling":{"max_tokens":0}}']], dtype=object)}, "max_tokens"),
])
def test_malformed_llm_inputs_are_final_errors(setup, inputs, field):
    engine, _, serving = setup
    r = Request(inputs)
    serving.execute([r])
    (resp, flags), = r.sender.sent
    assert flags == FINAL and meta_of(resp).error.startswith(field), meta_of(resp).error
    assert engine.added == []


def test_shutdown_ends_every_stream(setup):
    engine, _, serving = setup
    r1, r2 = llm_request(), llm_request(stream=False)
    serving.execute([r1, r2])
    engine.emit(engine.added[0][0], [1])
    serving.shutdown()
    for r in (r1, r2):
        assert r.sender.sent[-1][1] == FINAL
        assert meta_of(r.sender.sent[-1][0]).request_finished


def test_callbacks_from_another_thread_keep_order(setup):
    engine, _, serving = setup
    reqs = [llm_request() for _ in range(8)]
    serving.execute(reqs)

    def drive():
        for k in range(20):
            for rid, *_ in engine.added:
                engine.emit(rid, [k], k == 19, k == 19, FinishReason.LENGTH if k == 19 else None)

    t = threading.Thread(target=drive)
    t.start()
    t.join()
    for r in reqs:
        assert [ids_of(s)[0] for s, _ in r.sender.sent] == list(range(20))
        assert [f for _, f in r.sender.sent].count(FINAL) == 1


def test_wire_roundtrip_of_sampling_params():
    sp = SamplingParams(max_tokens=7, temperature=0.5, top_k=3, seed=2**64 - 1, stop_token_ids=(1, 2),
                        bad_words_ids=((4, 5), (6,)), logprobs=0)
    req = wire.LLMRequest.from_json(wire.LLMRequest(sp, stream=False, options='{"a":1}', request_id="x").to_json())
    assert req.sampling == sp and req.stream is False and req.options == '{"a":1}' and req.request_id == "x"
    guided = SamplingParams(max_tokens=7, bad_words_ids=((4, 5),), guide=GuideSpec("regex", "a+"))
    assert wire.LLMRequest.from_json(wire.LLMRequest(guided).to_json()).sampling == guided
    with pytest.raises(ValueError, match="top_p"):
        wire.LLMRequest.from_json(json.dumps({"sampling": {"top_p": 2.0}}))
    with pytest.raises(ValueError, match="unknown fields"):
        wire.LLMRequest.from_json(json.dumps({"sampling": {"nope": 1}}))


def test_parameters_split_and_paths_resolved(tmp_path):
    params = resolve_paths({"model_path": "models/demo-target", "draft_model_path": "", "metrics_interval_s": "2"},
                           root=tmp_path)
    engine, serving = split_parameters(params)
    assert engine["model_path"] == str(tmp_path / "models/demo-target") and engine["draft_model_path"] == ""
    assert "metrics_interval_s" not in engine and serving["metrics_interval_s"] == "2"
    assert serving["cancel_poll_interval_s"] == "0.2"
    assert resolve_paths({"model_path": "/abs"})["model_path"] == "/abs"
