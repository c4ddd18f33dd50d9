"""Bad requests get an error naming the field at fault, and the server keeps serving."""
from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.e2e.helpers import kv_used, run, run_inputs, wait_until
from cli.client import build_inputs


def raw_input(name: str, arr: np.ndarray, dtype: str):
    inp = grpcclient.InferInput(name, list(arr.shape), dtype)
    inp.set_data_from_numpy(arr)
    return inp


def text(value: bytes) -> np.ndarray:
    return np.asarray([[value]], dtype=np.object_)


def i32(v) -> np.ndarray:
    return np.asarray([[v]], dtype=np.int32)


def f32(v) -> np.ndarray:
    return np.asarray([[v]], dtype=np.float32)


def without(name: str, **opts):
    return [i for i in build_inputs("def f():", 4, **opts) if i.name() != name]


def replaced(name: str, arr: np.ndarray, dtype: str, **opts):
    return without(name, **opts) + [raw_input(name, arr, dtype)]


BAD = {
    "missing text_input": (lambda: without("text_input"), "text_input"),
    "missing max_tokens": (lambda: without("max_tokens"), "max_tokens"),
    "max_tokens as FP32": (lambda: replaced("max_tokens", f32(4.0), "FP32"), "max_tokens"),
    "temperature as INT32": (lambda: replaced("temperature", i32(1), "INT32"), "temperature"),
    "text_input as INT32": (lambda: replaced("text_input", i32(1), "INT32"), "text_input"),
    "max_tokens = 0": (lambda: build_inputs("def f():", 0), "max_tokens"),
    "max_tokens < 0": (lambda: build_inputs("def f():", -3), "max_tokens"),
    "max_tokens beyond the context": (lambda: build_inputs("def f():", 100_000), "max_tokens"),
    "top_p = 2": (lambda: build_inputs("def f():", 4, top_p=2.0), "top_p"),
    "top_p = 0": (lambda: build_inputs("def f():", 4, top_p=0.0), "top_p"),
    "temperature NaN": (lambda: build_inputs("def f():", 4, temperature=float("nan")), "temperature"),
    "temperature < 0": (lambda: build_inputs("def f():", 4, temperature=-1.0), "temperature"),
    "top_k < 0": (lambda: build_inputs("def f():", 4, top_k=-1), "top_k"),
    "min_p = 1.5": (lambda: build_inputs("def f():", 4, min_p=1.5), "min_p"),
    "repetition_penalty = 0": (lambda: build_inputs("def f():", 4, repetition_penalty=0.0), "repetition_penalty"),
    "presence_penalty = 3": (lambda: build_inputs("def f():", 4, presence_penalty=3.0), "presence_penalty"),
    "frequency_penalty = inf": (lambda: build_inputs("def f():", 4, frequency_penalty=float("inf")),
                                "frequency_penalty"),
    "invalid UTF-8": (lambda: build_inputs(b"def \xff\xfe f():", 4), "text_input"),
    "unknown guide type": (lambda: build_inputs("def f():", 4, guided_decoding_guide_type="xml"),
                           "guided_decoding_guide_type"),
    "bad JSON schema": (lambda: build_inputs("def f():", 4, guided_decoding_guide_type="json_schema",
                                             guided_decoding_guide="{not json"), "guided_decoding_guide"),
    "1 MB prompt": (lambda: build_inputs("x" * 1_000_001, 4), "text_input"),
    "prompt longer than the context": (lambda: build_inputs("a = 1\n" * 2000, 4), "text_input"),
    "empty prompt": (lambda: build_inputs("", 4), "text_input"),
    "num_return_sequences = 0": (lambda: build_inputs("def f():", 4, num_return_sequences=0),
                                 "num_return_sequences"),
    "min_tokens > max_tokens": (lambda: build_inputs("def f():", 4, min_tokens=9), "min_tokens"),
    "beam_width = 4": (lambda: build_inputs("def f():", 4, beam_width=4), "beam_width"),
    "empty stop word": (lambda: build_inputs("def f():", 4, stop_words=[""]), "stop_words"),
    "end_id outside the vocabulary": (lambda: build_inputs("def f():", 4, end_id=10**6), "end_id"),
    "messages not JSON": (lambda: build_inputs("", 4, messages="[{oops"), "messages"),
    "messages and text_input": (lambda: build_inputs("hi", 4, messages=[{"role": "user", "content": "x"}]),
                                "messages"),
    "batch of two prompts": (lambda: [raw_input("text_input", np.asarray([[b"a"], [b"b"]], dtype=np.object_), "BYTES"),
                                      raw_input("max_tokens", np.asarray([[4], [4]], dtype=np.int32), "INT32")],
                             "text_input"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_an_error_naming_the_field(server, case):
    make, field = BAD[case]
    res = run_inputs(server.grpc_url, make())
    assert res.error is not None, f"{case}: expected an error, got {res.chunks}"
    assert field in res.error, f"{case}: error does not name {field!r}: {res.error}"
    assert not res.chunks


def test_server_keeps_serving_after_bad_inputs(server):
    for make, _ in BAD.values():
        assert run_inputs(server.grpc_url, make()).error is not None
    good = run(server.grpc_url, "def f():", 4, temperature=0.0, exclude_input_in_output=True)
    assert good.error is None and good.num_final == 1 and good.num_output_tokens >= 1
    wait_until(lambda: kv_used(server.metrics_url) == 0, 10, "no KV blocks held by failed requests")
