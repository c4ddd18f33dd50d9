"""Text the gRPC request cannot carry: a lone UTF-16 surrogate (JSON's ``"\\ud800"`` escape) anywhere in an OpenAI
body is a 400 naming the parameter, not a 500 (found by tests/e2e/test_fuzz_live.py); other Unicode passes."""
from __future__ import annotations

import json

import httpx
import pytest

from tests.gateway.openai_harness import MODEL, served

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
COMPLETION = {"model": MODEL, "prompt": "hi", "max_tokens": 1}


@pytest.fixture(scope="module")
def base_url():
    with served() as s:
        yield s.base_url


@pytest.mark.parametrize("path, body, param", [
    ("/v1/completions", {**COMPLETION, "prompt": "\ud800"}, "prompt"),
    ("/v1/completions", {**COMPLETION, "prompt": ["ok", "a\udfffb"]}, "prompt"),
    ("/v1/completions", {**COMPLETION, "stop": ["\ud801"]}, "stop"),
    ("/v1/completions", {**COMPLETION, "user": "\udc00"}, "user"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": "x\ud800"}]}, "messages"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "\ud800", "content": "x"}]}, "messages"),
])
def test_a_lone_surrogate_is_a_400_naming_the_parameter(base_url, path, body, param):
    r = httpx.post(base_url + path, content=json.dumps(body), headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and "lone surrogate" in error["message"], error


def test_other_unicode_passes(base_url):
    r = httpx.post(base_url + "/v1/completions", json={**COMPLETION, "prompt": "x\u00e9\U0001f600\u202e"})
    assert r.status_code == 200 and r.json()["choices"]
