"""Triton's HTTP generate extension on the ensemble: ``generate`` and ``generate_stream`` work, and a JSON
key that is no input (Triton passes it on as a request parameter) is refused naming it."""
from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from tests.e2e.helpers import kv_used, wait_until


def post(server, path: str, body: dict) -> tuple[int, str]:
    req = urllib.request.Request(f"http://{server.server.http_url}/v2/models/ensemble/{path}",
                                 data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_generate_and_generate_stream(server):
    status, body = post(server, "generate", {"text_input": "def f(", "max_tokens": 4, "temperature": 0})
    assert status == 200, body
    out = json.loads(body)
    assert out["text_output"].startswith("def f(") and out["num_output_tokens"] == 4
    status, body = post(server, "generate_stream", {"text_input": "def f(", "max_tokens": 3, "stream": True,
                                                     "exclude_input_in_output": True, "temperature": 0})
    assert status == 200, body
    events = [json.loads(line[len("data: "):]) for line in body.splitlines() if line.startswith("data: ")]
    assert events and events[-1]["finish_reason"] == "length"


@pytest.mark.parametrize("path", ["generate", "generate_stream"])
def test_an_unknown_field_is_refused_by_name(server, path):
    status, body = post(server, path, {"text_input": "def f(", "max_tokens": 4, "tempreature": 0.5})
    assert "tempreature" in body and "did you mean temperature?" in body, (status, body)
    assert status != 200 or path == "generate_stream", body    # a stream reports its error as an event
    status, body = post(server, "generate", {"text_input": "def f(", "max_tokens": 2})
    assert status == 200, body                                  # and the server keeps serving
    wait_until(lambda: kv_used(server.metrics_url) == 0, 10, "no KV block held by the refused request")


def test_a_wrongly_typed_value_is_refused_by_triton(server):
    """tritonserver converts the JSON to the input's type before any model runs: its message names no field
    (``attempt to access JSON non-number as double``), and nothing in the model repository changes that."""
    status, body = post(server, "generate", {"text_input": "def f(", "max_tokens": 4, "temperature": "hot"})
    assert status != 200 and "error" in json.loads(body), body
    status, body = post(server, "generate", {"text_input": "def f(", "max_tokens": 2})
    assert status == 200, body
