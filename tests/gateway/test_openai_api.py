"""The OpenAI-compatible API through the real ``openai`` SDK against a fake Triton: the objects and chunks,
the parameters as the ensemble receives them, errors in OpenAI's shape and codes, cancellation.
The same API against the real tritonserver is in tests/e2e/test_openai.py."""
from __future__ import annotations

import asyncio
import json
import ssl
import struct
import time

import httpx
import openai
import pytest

from tests.gateway.fake_triton import FakeTriton, decode_input, error, inputs_of, response
from tests.gateway.openai_harness import FAKE_PARAMS, MODEL, served


@pytest.fixture(scope="module")
def srv():
    with served() as s:
        yield s


@pytest.fixture()
def fake(srv):
    srv.fake.script = lambda req: [response("hello", n_out=1), response(" world", finish="length", n_out=2, final=True)]
    srv.fake.requests.clear()
    srv.fake.ready = True
    return srv.fake


@pytest.fixture()
def client(srv):
    return openai.OpenAI(base_url=srv.base_url + "/v1", api_key="none", max_retries=0)


def sent(fake: FakeTriton, i: int = -1) -> dict[str, list]:
    return {name: decode_input(dt, raw) for name, (dt, _, raw) in inputs_of(fake.requests[i]).items()}


def chat(client, **kw):
    kw.setdefault("messages", [{"role": "user", "content": "hi"}])
    return client.chat.completions.create(model=MODEL, **kw)


def api_error(fn) -> openai.APIStatusError:
    with pytest.raises(openai.APIStatusError) as e:
        fn()
    return e.value


# ---- chat ---------------------------------------------------------------------------------------------

def test_chat_not_streamed(client, fake):
    out = chat(client, max_tokens=2)
    assert out.object == "chat.completion" and out.model == MODEL
    assert out.choices[0].message.role == "assistant" and out.choices[0].message.content == "hello world"
    assert out.choices[0].finish_reason == "length"
    assert (out.usage.prompt_tokens, out.usage.completion_tokens, out.usage.total_tokens) == (4, 2, 6)


def test_chat_streamed_role_first_usage_last(client, fake):
    chunks = list(chat(client, max_tokens=2, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "hello world"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 2
    assert all(c.usage is None for c in chunks[:-1])


def test_chat_parameters_reach_the_ensemble(client, fake):
    chat(client, messages=[{"role": "developer", "content": "be brief"},
                           {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
         max_tokens=9, max_completion_tokens=3, temperature=0.5, top_p=0.9, seed=7, stop=["\n\n", "END"],
         presence_penalty=0.1, frequency_penalty=0.2, n=1, extra_body={"top_k": -1, "min_p": 0.1,
                                                                       "repetition_penalty": 1.1, "min_tokens": 1})
    got = sent(fake)
    assert json.loads(got["messages"][0]) == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "ab"}]
    assert got["max_tokens"] == [3]                      # max_completion_tokens wins
    assert got["top_k"] == [0] and got["seed"] == [7] and got["stop_words"] == ["\n\n", "END"]
    assert got["exclude_input_in_output"] == [True] and got["return_num_output_tokens"] == [True]
    assert got["temperature"] == [pytest.approx(0.5)] and got["min_tokens"] == [1]


def test_ignore_eos_and_logit_bias_reach_the_ensemble(client, fake):
    """vLLM's extra ``ignore_eos`` (load generators' ``extra_body``) and OpenAI's ``logit_bias``, chat and completions."""
    chat(client, logit_bias={"17": 2.5, "5": -100}, extra_body={"ignore_eos": True})
    got = sent(fake)
    assert got["ignore_eos"] == [True] and json.loads(got["logit_bias"][0]) == {"5": -100.0, "17": 2.5}
    client.completions.create(model=MODEL, prompt="x", max_tokens=4, logit_bias={"3": 1}, extra_body={"ignore_eos": True})
    got = sent(fake)
    assert got["ignore_eos"] == [True] and json.loads(got["logit_bias"][0]) == {"3": 1.0}
    chat(client, extra_body={"ignore_eos": False}, logit_bias={})
    assert "ignore_eos" not in sent(fake) and "logit_bias" not in sent(fake)   # the ensemble's defaults


@pytest.mark.parametrize("bias, message", [
    ({"5": 150}, "logit_bias: the bias of token 5 must be in [-100, 100], got 150"),
    ({"5": -100.5}, "logit_bias: the bias of token 5 must be in [-100, 100], got -100.5"),
    ({"a5": 1}, "logit_bias: key 'a5' is not a token id (a decimal integer)"),
    ({"-1": 1}, "logit_bias: key '-1' is not a token id (a decimal integer)"),
    ({"99999999999": 1}, "logit_bias: token id 99999999999 is outside the vocabulary"),
])
def test_a_bad_logit_bias_is_a_400_naming_the_token(client, fake, bias, message):
    for call in (lambda: chat(client, logit_bias=bias),
                 lambda: client.completions.create(model=MODEL, prompt="x", logit_bias=bias)):
        e = api_error(call)
        assert e.status_code == 400 and e.body["param"] == "logit_bias" and e.body["message"] == message
    assert not fake.requests                                             # refused before the ensemble


def test_the_ensembles_logit_bias_and_ignore_eos_errors_name_the_param(client, fake):
    fake.script = lambda req: [error("in ensemble 'ensemble', logit_bias: token id 5000 is outside the vocabulary "
                                     "[0, 4096)")]
    e = api_error(lambda: chat(client, logit_bias={"5000": 1}))
    assert e.status_code == 400 and e.body["param"] == "logit_bias"
    assert e.body["message"] == "logit_bias: token id 5000 is outside the vocabulary [0, 4096)"
    fake.script = lambda req: [error("in ensemble 'ensemble', ignore_eos: not supported with guided decoding (the "
                                     "grammar ends with EOS)")]
    e = api_error(lambda: chat(client, response_format={"type": "json_object"}, extra_body={"ignore_eos": True}))
    assert e.status_code == 400 and e.body["param"] == "ignore_eos"


def test_chat_default_max_tokens_is_the_context(client, fake):
    chat(client)
    assert sent(fake)["max_tokens"] == [int(FAKE_PARAMS["max_model_len"])]


def test_n_2_choices_carry_their_index(client, fake):
    fake.script = lambda req: [response("a", seq=0), response("b", seq=1), response("A", seq=0, finish="stop"),
                               response("B", seq=1, finish="length", final=True)]
    out = chat(client, n=2)
    assert [(c.index, c.message.content, c.finish_reason) for c in out.choices] == [(0, "aA", "stop"), (1, "bB", "length")]
    assert sent(fake)["num_return_sequences"] == [2]
    chunks = list(chat(client, n=2, stream=True))
    by_index: dict[int, str] = {}
    for c in chunks:
        for ch in c.choices:
            by_index[ch.index] = by_index.get(ch.index, "") + (ch.delta.content or "")
    assert by_index == {0: "aA", 1: "bB"}


def test_logprobs_of_the_chosen_tokens(client, fake):
    fake.script = lambda req: [response("a", logprobs=[-0.5]), response("b", logprobs=[-1.5], finish="stop", final=True)]
    out = chat(client, logprobs=True)
    assert [(t.token, t.logprob) for t in out.choices[0].logprobs.content] == [("a", -0.5), ("b", -1.5)]
    assert sent(fake)["return_log_probs"] == [True]


def _tops(*alternatives: list[tuple[str, float]]) -> dict:
    raw = json.dumps([[{"token_id": i, "token": t, "logprob": lp} for i, (t, lp) in enumerate(a)]
                      for a in alternatives]).encode()
    return {"top_log_probs": ("BYTES", struct.pack("<I", len(raw)) + raw)}


def test_top_logprobs_chat_and_completions(client, fake):
    fake.script = lambda req: [
        response("a", logprobs=[-0.5], extra=_tops([("a", -0.5), ("b", -1.0)])),
        response("b", logprobs=[-1.5], extra=_tops([("c", -0.75), ("b", -1.5)]), finish="stop", final=True)]
    out = chat(client, logprobs=True, top_logprobs=2)
    content = out.choices[0].logprobs.content
    assert [[(a.token, a.logprob) for a in t.top_logprobs] for t in content] == [
        [("a", -0.5), ("b", -1.0)], [("c", -0.75), ("b", -1.5)]]
    assert content[1].top_logprobs[0].bytes == [ord("c")] and sent(fake)["top_logprobs"] == [2]
    comp = client.completions.create(model=MODEL, prompt="x", logprobs=2)
    assert comp.choices[0].logprobs.top_logprobs == [{"a": -0.5, "b": -1.0}, {"c": -0.75, "b": -1.5}]
    assert sent(fake, -1)["top_logprobs"] == [2]
    plain = client.completions.create(model=MODEL, prompt="x", logprobs=0)
    assert plain.choices[0].logprobs.top_logprobs is None and "top_logprobs" not in sent(fake, -1)


# ---- completions --------------------------------------------------------------------------------------

def test_completions_prompts_echo_and_streaming(client, fake):
    out = client.completions.create(model=MODEL, prompt=["x", "y"], echo=True)
    assert [(c.index, c.text) for c in out.choices] == [(0, "xhello world"), (1, "yhello world")]
    assert sent(fake, -1)["max_tokens"] == [16] and out.usage.prompt_tokens == 8
    chunks = list(client.completions.create(model=MODEL, prompt="x", stream=True,
                                            stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == "hello world"
    assert chunks[-1].usage.completion_tokens == 2


# ---- structured output and tools ----------------------------------------------------------------------

WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "time", "parameters": {"type": "object", "properties": {}}}}


def test_response_format_becomes_the_guide(client, fake):
    fake.script = lambda req: [response('{"a":1}', finish="stop", final=True)]
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    out = chat(client, response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    assert json.loads(out.choices[0].message.content) == {"a": 1}
    got = sent(fake)
    assert got["guided_decoding_guide_type"] == ["json_schema"] and json.loads(got["guided_decoding_guide"][0]) == schema
    chat(client, response_format={"type": "json_object"})
    assert sent(fake)["guided_decoding_guide_type"] == ["json"]


def test_a_refused_schema_keyword_is_a_400_on_response_format(client, fake):
    fake.script = lambda req: [error("in ensemble 'ensemble', guided_decoding_guide: keyword 'not' at /: "
                                     "xgrammar does not enforce it")]
    e = api_error(lambda: chat(client, response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"not": {"type": "string"}}}}))
    assert e.status_code == 400 and e.body["param"] == "response_format.json_schema.schema" and "'not'" in e.message


def test_named_tool_call(client, fake):
    fake.script = lambda req: [response('{"city":', n_out=2), response('"Oslo"}', finish="stop", final=True)]
    out = chat(client, tools=[WEATHER, TIME], tool_choice={"type": "function", "function": {"name": "weather"}})
    call = out.choices[0].message.tool_calls[0]
    assert call.function.name == "weather" and json.loads(call.function.arguments) == {"city": "Oslo"}
    assert out.choices[0].finish_reason == "stop" and out.choices[0].message.content is None
    assert json.loads(sent(fake)["guided_decoding_guide"][0]) == WEATHER["function"]["parameters"]
    chunks = list(chat(client, stream=True, tools=[WEATHER], tool_choice={"type": "function",
                                                                          "function": {"name": "weather"}}))
    calls = [tc for c in chunks for ch in c.choices for tc in (ch.delta.tool_calls or [])]
    assert calls[0].id and calls[0].function.name == "weather" and calls[0].function.arguments == ""
    assert all(tc.index == 0 and tc.id is None for tc in calls[1:])
    assert "".join(tc.function.arguments for tc in calls) == '{"city":"Oslo"}'


def test_required_tool_call_streamed_and_not(client, fake):
    text = '{"name":"weather","arguments":{"city":"Oslo"}}'
    fake.script = lambda req: [response(text[:20]), response(text[20:38]), response(text[38:], finish="stop", final=True)]
    out = chat(client, tools=[WEATHER, TIME], tool_choice="required")
    call = out.choices[0].message.tool_calls[0]
    assert (call.function.name, json.loads(call.function.arguments)) == ("weather", {"city": "Oslo"})
    assert out.choices[0].finish_reason == "tool_calls"
    guide = json.loads(sent(fake)["guided_decoding_guide"][0])
    assert [b["properties"]["name"]["const"] for b in guide["anyOf"]] == ["weather", "time"]
    chunks = list(chat(client, stream=True, tools=[WEATHER, TIME], tool_choice="required"))
    calls = [tc for c in chunks for ch in c.choices for tc in (ch.delta.tool_calls or [])]
    assert calls[0].function.name == "weather"
    assert json.loads("".join(tc.function.arguments for tc in calls)) == {"city": "Oslo"}
    assert [ch.finish_reason for c in chunks for ch in c.choices if ch.finish_reason] == ["tool_calls"]


def test_auto_tool_call_is_parsed(client, fake):
    text = 'Let me look.<tool_call>{"name": "weather", "arguments": {"city": "Oslo"}}</tool_call>'
    fake.script = lambda req: [response(text[:14]), response(text[14:], finish="stop", final=True)]
    out = chat(client, tools=[WEATHER])
    msg = out.choices[0].message
    assert msg.content == "Let me look." and msg.tool_calls[0].function.name == "weather"
    assert out.choices[0].finish_reason == "tool_calls"
    assert "<tools>" in json.loads(sent(fake)["messages"][0])[0]["content"]
    kind, guide = sent(fake)["guided_decoding_guide_type"][0], sent(fake)["guided_decoding_guide"][0]
    tag = json.loads(guide)            # the call is decoded under the tools' schemas once it starts
    assert kind in ("structural_tag", b"structural_tag") and tag["triggers"] == ["<tool_call>"]
    assert tag["structures"][0]["schema"]["properties"]["name"] == {"const": "weather"}
    chunks = list(chat(client, tools=[WEATHER], stream=True))
    content = "".join(ch.delta.content or "" for c in chunks for ch in c.choices)
    assert content == "Let me look."
    calls = [tc for c in chunks for ch in c.choices for tc in (ch.delta.tool_calls or [])]
    assert json.loads("".join(tc.function.arguments for tc in calls)) == {"city": "Oslo"}


def test_auto_parses_every_call_unless_parallel_calls_are_off(client, fake):
    call = '<tool_call>{"name": "weather", "arguments": {"city": "%s"}}</tool_call>'
    fake.script = lambda req: [response(call % "Oslo" + call % "Rome", finish="stop", final=True)]
    out = chat(client, tools=[WEATHER])
    assert [json.loads(c.function.arguments)["city"] for c in out.choices[0].message.tool_calls] == ["Oslo", "Rome"]
    assert len({c.id for c in out.choices[0].message.tool_calls}) == 2
    out = chat(client, tools=[WEATHER], parallel_tool_calls=False)
    assert [json.loads(c.function.arguments)["city"] for c in out.choices[0].message.tool_calls] == ["Oslo"]
    chunks = list(chat(client, tools=[WEATHER], stream=True))
    calls = [tc for c in chunks for ch in c.choices for tc in (ch.delta.tool_calls or [])]
    assert sorted({tc.index for tc in calls}) == [0, 1] and sum(1 for tc in calls if tc.id) == 2


def test_tool_turns_go_back_through_the_template(client, fake):
    chat(client, messages=[{"role": "user", "content": "weather?"},
                           {"role": "assistant", "content": None, "tool_calls": [
                               {"id": "call_1", "type": "function",
                                "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}]},
                           {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}], tools=[WEATHER])
    msgs = json.loads(sent(fake)["messages"][0])
    assert '<tool_call>{"name": "weather", "arguments": {"city": "Oslo"}}</tool_call>' in msgs[2]["content"]
    assert msgs[3] == {"role": "tool", "content": "<tool_response>sunny</tool_response>"}


# ---- errors ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kw, param", [
    ({"temperature": 3.0}, "temperature"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ({"extra_body": {"no_such_field": 1}}, "no_such_field"),
    ({"logit_bias": {"1": 200.0}}, "logit_bias"),
    ({"logit_bias": {"1": "high"}}, "logit_bias.1"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"messages": [{"role": "user", "content": "x", "name": "bob"}]}, "messages[0].name"),
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}, "tools": [WEATHER]}, "tool_choice.function.name"),
])
def test_bad_fields_are_400_naming_the_param(client, fake, kw, param):
    e = api_error(lambda: chat(client, **kw))
    assert e.status_code == 400 and e.body["param"] == param and e.body["type"] == "invalid_request_error"


def test_completions_refuses_what_it_does_not_implement(client, fake):
    for kw, param in (({"best_of": 3}, "best_of"), ({"suffix": "x"}, "suffix")):
        e = api_error(lambda: client.completions.create(model=MODEL, prompt="x", **kw))
        assert e.status_code == 400 and e.body["param"] == param


def test_an_ensemble_field_error_names_the_openai_param(client, fake):
    fake.script = lambda req: [error("in ensemble 'ensemble', num_return_sequences: at most 16 parallel samples")]
    e = api_error(lambda: chat(client, n=99))
    assert e.status_code == 400 and e.body["param"] == "n" and e.body["message"].startswith("n:")
    e = api_error(lambda: chat(client, n=99, stream=True))
    assert e.status_code == 400 and e.body["param"] == "n"


def test_unknown_model_is_404(client, fake):
    e = api_error(lambda: client.chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "x"}]))
    assert e.status_code == 404 and e.body["code"] == "model_not_found"


def test_not_ready_is_503(srv, client, fake):
    fake.ready = False
    try:
        deadline = time.monotonic() + 5
        while srv.gw.upstream.ready and time.monotonic() < deadline:
            time.sleep(0.02)
        e = api_error(lambda: chat(client))
        assert e.status_code == 503 and e.response.headers.get("retry-after")
        assert httpx.get(srv.base_url + "/health/ready").status_code == 503
        assert httpx.get(srv.base_url + "/health").status_code == 200
    finally:
        fake.ready = True
        while not srv.gw.upstream.ready:
            time.sleep(0.02)


def test_an_error_after_the_first_byte_is_an_error_event(srv, fake):
    fake.script = lambda req: [response("partial"), error("in ensemble 'ensemble', something broke")]
    with httpx.stream("POST", srv.base_url + "/v1/chat/completions", json={
            "model": MODEL, "messages": [{"role": "user", "content": "x"}], "stream": True}) as r:
        assert r.status_code == 200
        events = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert json.loads(events[-1][6:])["error"]["type"] == "server_error"
    assert "data: [DONE]" not in events


def test_client_disconnect_cancels_upstream(srv, fake):
    fake.script = lambda req: [response("a"), "hang"]
    before = fake.cancelled
    with httpx.stream("POST", srv.base_url + "/v1/chat/completions", json={
            "model": MODEL, "messages": [{"role": "user", "content": "x"}], "stream": True}) as r:
        for line in r.iter_lines():
            if '"a"' in line:
                break
    deadline = time.monotonic() + 5
    while fake.cancelled == before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert fake.cancelled == before + 1
    before = fake.cancelled
    with pytest.raises(httpx.ReadTimeout):   # not streamed: the client gives up
        httpx.post(srv.base_url + "/v1/completions", json={"model": MODEL, "prompt": "x"}, timeout=0.5)
    deadline = time.monotonic() + 5
    while fake.cancelled == before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert fake.cancelled == before + 1
    deadline = time.monotonic() + 5
    while srv.gw.service.inflight and time.monotonic() < deadline:
        time.sleep(0.02)
    assert srv.gw.service.inflight == 0      # every slot of the limit is back


def test_auth_and_concurrency_limit():
    fake = FakeTriton(llm_parameters=dict(FAKE_PARAMS), script=lambda req: [response("a"), 0.5,
                                                                           response("b", finish="stop", final=True)])
    with served(fake, auth_tokens=("s3cret",), max_inflight=1) as s:
        bad = openai.OpenAI(base_url=s.base_url + "/v1", api_key="wrong", max_retries=0)
        e = api_error(lambda: chat(bad))
        assert e.status_code == 401 and e.body["code"] == "invalid_api_key"
        good = openai.AsyncOpenAI(base_url=s.base_url + "/v1", api_key="s3cret", max_retries=0)

        async def two():
            return await asyncio.gather(*(good.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "x"}]) for _ in range(2)), return_exceptions=True)
        results = asyncio.run(two())
        limited = [r for r in results if isinstance(r, openai.RateLimitError)]
        assert len(limited) == 1 and limited[0].body["code"] == "rate_limit_exceeded"
        assert limited[0].response.headers["retry-after"]
        assert [r.choices[0].message.content for r in results if not isinstance(r, Exception)] == ["ab"]


def test_models_health_openapi(srv, client):
    assert [m.id for m in client.models.list()] == [MODEL, "ensemble"]
    assert client.models.retrieve(MODEL).id == MODEL
    assert api_error(lambda: client.models.retrieve("gpt-9")).status_code == 404
    doc = httpx.get(srv.base_url + "/openapi.json").json()
    assert {"/v1/chat/completions", "/v1/completions", "/v1/models"} <= set(doc["paths"])
    r = httpx.post(srv.base_url + "/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "body"


def test_traceparent_reaches_triton_and_big_bodies_are_413(srv, fake):
    tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    r = httpx.post(srv.base_url + "/v1/completions", headers={"traceparent": tp},
                   json={"model": MODEL, "prompt": "x"})
    assert r.status_code == 200 and fake.metadata[-1]["traceparent"] == tp
    r = httpx.post(srv.base_url + "/v1/completions", content=b"{" + b" " * (17 * 2**20) + b"}",
                   headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"

    def chunked():
        yield b'{"model": "demo-target", "prompt": "'
        for _ in range(17):
            yield b"x" * 2**20
        yield b'"}'
    r = httpx.post(srv.base_url + "/v1/completions", content=chunked(), headers={"content-type": "application/json"})
    assert r.status_code == 413


def test_a_missing_key_is_401_before_the_body_is_validated():
    with served(auth_tokens=("k",)) as s:
        r = httpx.post(s.base_url + "/v1/chat/completions", json={"model": MODEL, "temperature": 9})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert httpx.get(s.base_url + "/v1/models").status_code == 401
        assert httpx.get(s.base_url + "/v1/models", headers={"authorization": "Bearer k"}).status_code == 200


def test_triton_closing_the_stream_is_503_before_the_first_byte_and_an_event_after(client, srv, fake):
    fake.script = lambda req: ["close"]
    e = api_error(lambda: chat(client))
    assert e.status_code == 503 and e.response.headers["retry-after"] and e.body["code"] == "model_not_ready"
    fake.script = lambda req: [response("a"), "close"]
    with httpx.stream("POST", srv.base_url + "/v1/completions", json={"model": MODEL, "prompt": "x",
                                                                      "stream": True}) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert events[0]["choices"][0]["text"] == "a" and events[-1]["error"]["type"] == "service_unavailable"


def test_tls_covers_the_http_api_too(tmp_path):
    from tests.gateway.test_gateway_service import self_signed

    key, cert = self_signed(tmp_path)
    with served(tls_cert=cert, tls_key=key) as s:
        base = s.base_url.replace("http://", "https://").replace("127.0.0.1", "localhost")
        tls = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0,
                            http_client=httpx.Client(verify=ssl.create_default_context(cafile=str(cert))))
        assert chat(tls).choices[0].message.content == "hello world"
        with pytest.raises(httpx.HTTPError):
            httpx.get(s.base_url + "/health", timeout=5)      # plaintext is refused
