"""Hypothesis fuzz of the gateway's mapping, in process: a ``GenerateRequest`` with any field values (NaN and
infinite floats, extreme integers, empty, huge and odd strings, hostile guides, thousands of stop words) becomes
the ensemble's tensors (``build_infer_request``), the real preprocess judges them, and its error maps back to a
field of the proto (``map_triton_error``): no exception escapes, every error names a proto field. The same for
hostile OpenAI bodies through the HTTP API's schema, checks and parameter mapping."""
from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from cli.client import INPUT_TYPES
from gateway import mapping
from preprocess.request import RequestParser
from preprocess.serving import PreprocessServing
from preprocess.tokenizer import load_tokenizer
from tests.helpers.checkpoints import DEMO_TARGET
from tests.helpers.fuzz_requests import PROTO_FIELDS, generate_requests
from tests.helpers.triton_fakes import Request, make_pb_utils

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


OPENAI_CASES = 500


def test_openai_bodies_map_to_generate_requests_or_fail_naming_a_parameter():
    """The HTTP API's path in process: a hostile body (tests/helpers/fuzz_requests.py) is refused by its schema
    or its checks naming a parameter, or it becomes GenerateRequests the mapping turns into tensors."""
    import json

    from pydantic import ValidationError

    from gateway.openai import guides, params, prompt
    from gateway.openai.errors import APIError
    from gateway.openai.schemas import ChatCompletionRequest, CompletionRequest
    from tests.helpers.fuzz_requests import openai_bodies

    CASES["openai bodies"] = 0

    @settings(FUZZ, max_examples=OPENAI_CASES)
    @given(request=openai_bodies("demo-target"))
    def run(request):
        CASES["openai bodies"] += 1
        path, raw = request
        chat = path.endswith("chat/completions")
        try:
            body = (ChatCompletionRequest if chat else CompletionRequest).model_validate(json.loads(json.dumps(raw)))
        except ValidationError as e:
            assert e.errors()[0]["loc"], e
            return
        try:
            if body.refused() is not None:
                return
            if chat:
                plan = guides.plan(body)
                reqs = [params.chat_request(body, prompt.prompt_messages(body), 1024, plan.guide)]
            else:
                reqs = [params.completion_request(body, p) for p in body.prompts()]
        except APIError as e:
            assert e.status == 400 and e.param, e.message
            return
        for req in reqs:
            try:
                mapping.build_infer_request(req, "fuzz")
            except mapping.FieldError as e:
                assert e.field in PROTO_FIELDS, e
    run()
    assert CASES["openai bodies"] >= OPENAI_CASES
