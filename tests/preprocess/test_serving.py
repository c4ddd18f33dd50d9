"""preprocess/serving.py: the Triton glue around the request parser, with the demo tokenizer and fake Triton objects."""
from __future__ import annotations

import json

import numpy as np
import pytest

from contracts import wire
from preprocess.request import RequestParser
from preprocess.serving import PreprocessServing, model_context_length
from preprocess.tokenizer import load_tokenizer
from tests.helpers.checkpoints import DEMO_TARGET
from tests.helpers.triton_fakes import Request, make_pb_utils
from cli.client import INPUT_TYPES, to_array


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(DEMO_TARGET)


def triton_inputs(**values):
    return {k: to_array(k, v) for k, v in values.items()}


# ---- preprocess -------------------------------------------------------------------------------

@pytest.fixture
def pre(tokenizer):
    return PreprocessServing(RequestParser(tokenizer), make_pb_utils(), list(INPUT_TYPES))


def test_preprocess_tokenizes_and_packs_the_llm_request(pre, tokenizer):
    r = Request(triton_inputs(text_input="def f(x):", max_tokens=7, temperature=0.0, stream=True,
                              stop_words=["\n\n"]), request_id="client-1")
    resp, = pre.execute([r])
    assert not resp.has_error()
    ids = resp.tensor(wire.INPUT_IDS)
    assert ids.dtype == np.int32 and ids.shape[0] == 1
    assert ids.reshape(-1).tolist() == tokenizer.encode("def f(x):", add_special_tokens=True)
    req = wire.LLMRequest.from_json(resp.tensor(wire.REQUEST).reshape(-1)[0])
    assert req.sampling.max_tokens == 7 and req.sampling.temperature == 0.0 and req.stream
    assert req.request_id == "client-1" and json.loads(req.options)["stop"] == ["\n\n"]
    assert resp.tensor(wire.STOP).reshape(-1).tolist() == [False]


def test_preprocess_stop_request_skips_validation(pre):
    resp, = pre.execute([Request(triton_inputs(text_input="", max_tokens=0, stop=True), request_id="x")])
    assert not resp.has_error()
    assert resp.tensor(wire.STOP).reshape(-1).tolist() == [True]
    assert resp.tensor(wire.INPUT_IDS).size == 0


def test_preprocess_stop_request_alone(pre):
    """With every input optional in config.pbtxt, a stop request needs nothing but `stop`."""
    resp, = pre.execute([Request(triton_inputs(stop=True), request_id="x")])
    assert not resp.has_error() and resp.tensor(wire.STOP).reshape(-1).tolist() == [True]


def test_preprocess_messages_alone_and_missing_inputs(pre, tokenizer):
    """text_input and max_tokens are optional in config.pbtxt: preprocess names what is missing."""
    resp, = pre.execute([Request(triton_inputs(messages=[{"role": "user", "content": "hi"}], max_tokens=4))])
    assert not resp.has_error(), resp.error() and resp.error().message()
    resp, = pre.execute([Request(triton_inputs(max_tokens=4))])
    assert resp.error().message() == "text_input: required input is missing (or send messages)"
    resp, = pre.execute([Request(triton_inputs(text_input="x", temperature=0.5))])
    assert resp.error().message() == "max_tokens: required input is missing"


def test_preprocess_messages_with_empty_text_input_use_the_chat_template(pre, tokenizer):
    msgs = [{"role": "user", "content": "hi"}]
    resp, = pre.execute([Request(triton_inputs(text_input="", messages=msgs, max_tokens=4))])
    assert not resp.has_error(), resp.error() and resp.error().message()
    text = tokenizer.decode(resp.tensor(wire.INPUT_IDS).reshape(-1).tolist(), skip_special_tokens=False)
    assert "<|user|>" in text and text.rstrip().endswith("<|assistant|>")


@pytest.mark.parametrize("values, field", [
    (dict(text_input="x", max_tokens=4, top_p=2.0), "top_p"),
    (dict(text_input="x", max_tokens=0), "max_tokens"),
    (dict(text_input="x", max_tokens=4, guided_decoding_guide_type="xml"), "guided_decoding_guide_type"),
    (dict(text_input=b"\xff\xfe", max_tokens=4), "text_input"),
    (dict(text_input="x", max_tokens=4, messages=[{"role": "user", "content": "y"}]), "messages"),
])
def test_preprocess_client_errors_name_the_input(pre, values, field):
    resp, = pre.execute([Request(triton_inputs(**values))])
    assert resp.has_error() and resp.error().message().startswith(f"{field}:"), resp.error().message()


def test_preprocess_rejects_a_batch_of_prompts(pre):
    r = Request({"text_input": np.asarray([[b"a"], [b"b"]], dtype=object), "max_tokens": np.asarray([[2], [2]], np.int32)})
    resp, = pre.execute([r])
    assert resp.has_error() and resp.error().message().startswith("text_input: a request carries one prompt")


def test_preprocess_one_bad_request_does_not_fail_the_batch(pre):
    good, bad = Request(triton_inputs(text_input="a", max_tokens=2)), Request(triton_inputs(text_input="a", max_tokens=-1))
    r1, r2 = pre.execute([good, bad])
    assert not r1.has_error() and r2.has_error()


def test_preprocess_context_length_comes_from_the_checkpoint(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 256}))
    assert model_context_length(tmp_path) == 256
    assert model_context_length(tmp_path / "missing") is None


def test_unknown_fields_are_refused_by_name(pre):
    """Over HTTP, Triton passes generate's JSON keys that are no input as request parameters."""
    inputs = triton_inputs(text_input="def f(", max_tokens=4)
    resp, = pre.execute([Request(inputs, parameters='{"tempreature": 0.5, "bogus_field": 1}')])
    message = resp.error().message()
    assert message.startswith("bogus_field: unknown fields bogus_field, tempreature (did you mean temperature?)")
    assert "docs/api.md" in message
    resp, = pre.execute([Request(inputs, parameters="{}")])
    assert not resp.has_error()
    resp, = pre.execute([Request(inputs, parameters='{"stream": true}')])   # a gRPC parameter named as an input
    assert resp.error().message().startswith("stream: unknown field stream (an input: send it as a tensor)")
