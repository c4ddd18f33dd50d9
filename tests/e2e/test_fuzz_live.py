"""Hypothesis fuzz through the live pipeline: hostile requests straight to the ensemble over gRPC (Triton's KServe
v2 API), through the gateway's LLMService, and through its OpenAI HTTP API (strategies: tests/helpers/fuzz_inputs.py
and fuzz_requests.py). Every request ends (a hang fails the case at its timeout) with a complete answer or an error
that names a field (an input, a proto field, an OpenAI parameter), never an internal error; afterwards the server
still serves and the engine is idle with every KV block back. ``CASES`` counts what each test ran and served
(printed with ``-s``)."""
from __future__ import annotations

import json

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from hypothesis import HealthCheck, given, settings
from tritonclient.utils import np_to_triton_dtype

from preprocess.request import KNOWN_INPUTS
from tests.e2e.helpers import Stream, engine_idle, kv_used, run
from tests.helpers.fuzz_inputs import request_inputs
from tests.helpers.fuzz_requests import PROTO_FIELDS, generate_requests, openai_bodies
from triton_llm.v1 import llm_service_pb2_grpc as pb_grpc

FUZZ = settings(deadline=None, database=None, suppress_health_check=list(HealthCheck))
DIRECT_CASES, GRPC_CASES, HTTP_CASES = 150, 100, 100
TIMEOUT_S = 60.0      # a request that has not ended by then hangs
CASES: dict[str, int] = {}


@pytest.fixture(scope="module")
def gateway(openai_gateway):
    return openai_gateway


# the TensorRT-LLM LoRA tensors: the ensemble routes them to the llm model only
TO_LLM_ONLY = {"lora_task_id", "lora_weights", "lora_config"}


def still_serves(server) -> None:
    result = run(server.grpc_url, "def f(x):", 4, temperature=0.0)
    assert result.error is None and result.num_final == 1 and result.num_output_tokens >= 1
    engine_idle(server.metrics_url, "after the fuzz")
    assert kv_used(server.metrics_url) == 0


def infer_inputs(inputs: dict[str, np.ndarray]) -> list:
    out = []
    for name, arr in inputs.items():
        inp = grpcclient.InferInput(name, list(arr.shape), np_to_triton_dtype(arr.dtype))
        inp.set_data_from_numpy(arr)
        out.append(inp)
    return out


def test_direct_ensemble_fuzz(server):
    CASES["direct"] = 0

    @settings(FUZZ, max_examples=DIRECT_CASES)
    @given(inputs=request_inputs(live=True))
    def case(inputs):
        CASES["direct"] += 1
        with Stream(server.grpc_url) as s:
            rid = s.send(infer_inputs(inputs))
            result = s.wait([rid], TIMEOUT_S)[rid]
        if result.error is not None:
            assert "internal error" not in result.error, result.error
            if not set(inputs) - TO_LLM_ONLY and "request has 0 inputs" in result.error:
                return   # Triton refuses it before any model runs: nothing reaches preprocess (no field to name)
            assert any(name in result.error for name in KNOWN_INPUTS | set(inputs)), result.error
        else:
            assert result.num_final == 1
            CASES["direct served"] = CASES.get("direct served", 0) + 1
    case()
    assert CASES["direct"] >= DIRECT_CASES
    still_serves(server)


def test_gateway_grpc_fuzz(server, gateway):
    CASES["gateway gRPC"] = 0
    with grpc.insecure_channel(gateway.target) as channel:
        stub = pb_grpc.LLMServiceStub(channel)

        @settings(FUZZ, max_examples=GRPC_CASES)
        @given(req=generate_requests(live=True))
        def case(req):
            CASES["gateway gRPC"] += 1
            try:
                responses = list(stub.Generate(req, timeout=TIMEOUT_S))
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, (e.code(), e.details())
                assert e.details().split(":", 1)[0] in PROTO_FIELDS, e.details()
                return
            assert responses and responses[-1].HasField("usage")
            CASES["gateway gRPC served"] = CASES.get("gateway gRPC served", 0) + 1
        case()
    assert CASES["gateway gRPC"] >= GRPC_CASES
    still_serves(server)


def test_openai_http_fuzz(server, gateway):
    CASES["OpenAI HTTP"] = 0
    model = httpx.get(gateway.openai_url + "/v1/models").json()["data"][0]["id"]
    with httpx.Client(base_url=gateway.openai_url, timeout=TIMEOUT_S) as http:

        @settings(FUZZ, max_examples=HTTP_CASES)
        @given(request=openai_bodies(model))
        def case(request):
            CASES["OpenAI HTTP"] += 1
            path, body = request
            r = http.post(path, content=json.dumps(body), headers={"content-type": "application/json"})
            if r.status_code == 200:
                if body.get("stream") is True:
                    assert r.text.rstrip().endswith("data: [DONE]") or '"error"' in r.text, r.text[-300:]
                else:
                    assert r.json()["choices"]
                CASES["OpenAI HTTP served"] = CASES.get("OpenAI HTTP served", 0) + 1
                return
            assert r.status_code in (400, 404), (r.status_code, r.text[:300])
            error = r.json()["error"]
            if r.status_code == 404:
                assert error["param"] == "model", error
            else:
                assert error["param"] and error["message"].startswith(error["param"]), error
        case()
    assert CASES["OpenAI HTTP"] >= HTTP_CASES
    still_serves(server)
    print(f"\nlive fuzz cases (served): {CASES}")
