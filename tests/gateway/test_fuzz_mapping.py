"""Hypothesis fuzz of the gateway's mapping, in process: a ``GenerateRequest`` with any field values (NaN and
infinite floats, extreme integers, empty, huge and odd strings, hostile guides, thousands of stop words) becomes
the ensemble's tensors (``build_infer_request``), the real preprocess judges them, and its error maps back to a
field of the proto (``map_triton_error``): no exception escapes, every error names a proto field."""
from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cli.client import INPUT_TYPES
from gateway import mapping
from preprocess.request import RequestParser
from preprocess.serving import PreprocessServing
from preprocess.tokenizer import load_tokenizer
from tests.helpers.checkpoints import DEMO_TARGET
from tests.helpers.fuzz_inputs import NASTY_GUIDES
from tests.helpers.triton_fakes import Request, make_pb_utils
from triton_llm.v1 import llm_service_pb2 as pb

FUZZ = settings(deadline=None, database=None, suppress_health_check=list(HealthCheck))
GATEWAY_CASES = 1_000
CASES: dict[str, int] = {}


@pytest.fixture(scope="module")
def pre():
    return PreprocessServing(RequestParser(load_tokenizer(DEMO_TARGET)), make_pb_utils(), list(INPUT_TYPES))


_NUMPY = {"BOOL": np.bool_, "INT32": np.int32, "FP32": np.float32, "UINT64": np.uint64}


def as_arrays(req) -> dict[str, np.ndarray]:
    """What Triton hands preprocess for a ``ModelInferRequest``: each raw content as a numpy array."""
    out = {}
    for t, raw in zip(req.inputs, req.raw_input_contents):
        if t.datatype == "BYTES":
            items, i = [], 0
            while i < len(raw):
                (n,) = struct.unpack_from("<I", raw, i)
                items.append(raw[i + 4:i + 4 + n])
                i += 4 + n
            arr = np.empty(len(items), dtype=np.object_)
            arr[:] = items
        else:
            arr = np.frombuffer(raw, dtype=_NUMPY[t.datatype])
        out[t.name] = arr.reshape(list(t.shape))
    return out


FLOAT = st.one_of(st.floats(width=32, allow_nan=True, allow_infinity=True), st.sampled_from([0.0, 1.0, 2.0, -1.0]))
INT32 = st.one_of(st.integers(-(2**31), 2**31 - 1), st.integers(-2, 70))
TEXT = st.one_of(st.text(max_size=40), st.sampled_from(["def f(", "", " ", "x" * 1_000_001]))
GUIDED = st.one_of(
    st.builds(pb.GuidedDecoding),
    st.builds(lambda s: pb.GuidedDecoding(json_schema=s), st.sampled_from(NASTY_GUIDES) | st.text(max_size=20)),
    st.builds(lambda s: pb.GuidedDecoding(regex=s), st.sampled_from(NASTY_GUIDES) | st.text(max_size=20)),
    st.builds(lambda s: pb.GuidedDecoding(ebnf_grammar=s), st.sampled_from(NASTY_GUIDES) | st.text(max_size=20)),
    st.just(pb.GuidedDecoding(any_json=pb.GuidedDecoding.AnyJson())),
)
MESSAGES = st.lists(st.builds(pb.ChatMessage, role=st.sampled_from(["user", "", "system", "\x00"]), content=TEXT),
                    max_size=3).map(lambda ms: pb.ChatMessages(messages=ms))
GENERATE_FIELDS = {
    "temperature": FLOAT, "top_p": FLOAT, "min_p": FLOAT, "repetition_penalty": FLOAT, "presence_penalty": FLOAT,
    "frequency_penalty": FLOAT, "top_k": INT32, "end_id": INT32, "pad_id": INT32, "min_tokens": INT32,
    "num_return_sequences": INT32, "beam_width": INT32, "num_speculative_tokens": INT32,
    "seed": st.integers(0, 2**64 - 1), "stream": st.booleans(), "exclude_input_in_output": st.booleans(),
    "return_log_probs": st.booleans(), "skip_special_tokens": st.booleans(),
    "include_stop_str_in_output": st.booleans(),
    "stop_words": st.lists(TEXT, max_size=3) | st.integers(60, 70).map(lambda n: [f"s{i}" for i in range(n)]),
    "bad_words": st.lists(TEXT, max_size=3), "guided_decoding": GUIDED,
}


@st.composite
def generate_requests(draw) -> pb.GenerateRequest:
    req = pb.GenerateRequest(max_tokens=draw(st.one_of(st.integers(1, 8), INT32)))
    case = draw(st.sampled_from(["prompt", "prompt", "messages", None]))
    if case == "prompt":
        req.prompt = draw(TEXT)
    elif case == "messages":
        req.messages.CopyFrom(draw(MESSAGES))
    for name in draw(st.lists(st.sampled_from(sorted(GENERATE_FIELDS)), max_size=5, unique=True)):
        value = draw(GENERATE_FIELDS[name])
        if isinstance(value, list):
            getattr(req, name).extend(value)
        elif name == "guided_decoding":
            req.guided_decoding.CopyFrom(value)
        else:
            setattr(req, name, value)
    return req


PROTO_FIELDS = set(pb.GenerateRequest.DESCRIPTOR.fields_by_name) | {
    f"guided_decoding.{f}" for f in pb.GuidedDecoding.DESCRIPTOR.fields_by_name}


def test_gateway_mapping_round_trip_names_a_proto_field(pre):
    CASES["gateway mapping"] = 0

    @settings(FUZZ, max_examples=GATEWAY_CASES)
    @given(req=generate_requests())
    def run(req):
        CASES["gateway mapping"] += 1
        try:
            infer = mapping.build_infer_request(req, "fuzz")
        except mapping.FieldError as e:
            assert e.field in PROTO_FIELDS, e
            return
        resp, = pre.execute([Request(as_arrays(infer), request_id="fuzz")])
        if not resp.has_error():
            return
        err = mapping.map_triton_error(f"in ensemble 'ensemble', {resp.error().message()}", req, "fuzz")
        assert err.field in PROTO_FIELDS, (err.code, err.message)
        assert err.message.startswith(err.field + ":")
    run()
    assert CASES["gateway mapping"] >= GATEWAY_CASES
