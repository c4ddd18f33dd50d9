"""Hypothesis fuzz of the validation and mapping code, in process (the live fuzz is tests/e2e/test_fuzz_live.py):

- the ``preprocess`` model's adapter (``PreprocessServing.execute``, as Triton calls it) with hostile tensors of
  every input (tests/helpers/fuzz_inputs.py) and stray request parameters;
- the ``llm`` model's request JSON (``wire.LLMRequest.from_json``), which a client calling ``llm`` directly sends.

The gateway's mapping has its own (tests/gateway/test_fuzz_mapping.py). Each property: no exception escapes, no
internal error, every error starts with the name of a field (an input of the ensemble, a request parameter
sent). ``CASES`` counts what each test ran.
"""
from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cli.client import INPUT_TYPES
from contracts import wire
from contracts.sampling_params import SamplingParams
from preprocess.request import KNOWN_INPUTS, RequestParser
from preprocess.serving import PreprocessServing
from preprocess.tokenizer import load_tokenizer
from tests.helpers.checkpoints import DEMO_TARGET
from tests.helpers.fuzz_inputs import NASTY_GUIDES, request_inputs
from tests.helpers.triton_fakes import Request, make_pb_utils

FUZZ = settings(deadline=None, database=None, suppress_health_check=list(HealthCheck))
PREPROCESS_CASES, LLM_REQUEST_CASES = 2_500, 1_500
CASES: dict[str, int] = {}


@pytest.fixture(scope="module")
def pre():
    return PreprocessServing(RequestParser(load_tokenizer(DEMO_TARGET)), make_pb_utils(), list(INPUT_TYPES))


def field_of(message: str) -> str:
    return message.split(":", 1)[0]


def assert_names_a_field(message: str, fields) -> None:
    assert "internal error" not in message, message
    assert field_of(message) in fields, f"the error names no field: {message[:300]!r}"


# ---- preprocess ----------------------------------------------------------------------------------------------

PARAMETERS = st.one_of(*[st.just("{}")] * 9,
                       st.dictionaries(st.sampled_from(["max_new_tokens", "tempreature", "x", "stream"]),
                                       st.integers(), min_size=1, max_size=2).map(json.dumps))


def test_preprocess_answers_every_hostile_request_with_a_field_error_or_a_request(pre):
    CASES["preprocess"] = 0

    @settings(FUZZ, max_examples=PREPROCESS_CASES)
    @given(inputs=request_inputs(), parameters=PARAMETERS)
    def run(inputs, parameters):
        CASES["preprocess"] += 1
        resp, = pre.execute([Request(inputs, request_id="fuzz", parameters=parameters)])
        if resp.has_error():
            assert_names_a_field(resp.error().message(), KNOWN_INPUTS | set(INPUT_TYPES) | set(json.loads(parameters)))
            return
        req = wire.LLMRequest.from_json(resp.tensor(wire.REQUEST).reshape(-1)[0])
        assert resp.tensor(wire.INPUT_IDS).size >= 1 and req.sampling.max_tokens >= 1
    run()
    assert CASES["preprocess"] >= PREPROCESS_CASES


# ---- the llm model's request JSON -----------------------------------------------------------------------------

SAMPLING_FIELDS = [f.name for f in dataclasses.fields(SamplingParams)]
JSON_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True),
              st.text(max_size=12), st.sampled_from(NASTY_GUIDES[:12])),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12)
GUIDES = st.one_of(JSON_VALUES, st.fixed_dictionaries({"kind": JSON_VALUES, "guide": JSON_VALUES}))
SAMPLING = st.dictionaries(st.sampled_from(SAMPLING_FIELDS + ["beam", ""]), JSON_VALUES, max_size=6)
LLM_REQUESTS = st.one_of(
    st.binary(max_size=64),
    JSON_VALUES.map(json.dumps).map(str.encode),
    st.fixed_dictionaries({"sampling": SAMPLING}, optional={
        "stream": JSON_VALUES, "options": JSON_VALUES, "request_id": JSON_VALUES}).map(json.dumps).map(str.encode),
    st.fixed_dictionaries({"sampling": st.fixed_dictionaries({"max_tokens": st.integers(-2, 8), "guide": GUIDES})})
    .map(json.dumps).map(str.encode),
)
LLM_FIELDS = {"request", "request.sampling", "request.options", *SAMPLING_FIELDS, "guided_decoding_guide_type"}


def test_llm_request_json_is_a_request_or_an_error_naming_the_field():
    CASES["llm request"] = 0

    @settings(FUZZ, max_examples=LLM_REQUEST_CASES)
    @given(raw=LLM_REQUESTS)
    def run(raw):
        CASES["llm request"] += 1
        try:
            req = wire.LLMRequest.from_json(raw)
        except ValueError as e:
            assert_names_a_field(str(e), LLM_FIELDS)
            return
        assert isinstance(req.sampling, SamplingParams)
    run()
    assert CASES["llm request"] >= LLM_REQUEST_CASES
