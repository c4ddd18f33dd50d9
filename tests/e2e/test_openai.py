"""The OpenAI-compatible API through the real ``openai`` SDK (sync and async, ``max_retries=0``) against the
gateway in front of the real tritonserver: text, n, seeds, stops, logprobs and top logprobs, usage,
``ignore_eos`` and ``logit_bias``, structured output and tool calls that validate, errors, a disconnect that frees KV, 32 concurrent streams,
the router's metrics.
One gateway (module scope) in front of the session's server."""
from __future__ import annotations

import asyncio
import json

import httpx
import jsonschema
import openai
import pytest

from tests.e2e.helpers import metrics
from bench.harness.guides import SCHEMAS

PROMPT = [{"role": "user", "content": "def fibonacci(n):"}]


@pytest.fixture(scope="module")
def api(openai_gateway):
    return openai_gateway


@pytest.fixture(scope="module")
def model(api) -> str:
    return httpx.get(api.openai_url + "/v1/models").json()["data"][0]["id"]


@pytest.fixture(scope="module")
def client(api):
    return openai.OpenAI(base_url=api.openai_url + "/v1", api_key="none", max_retries=0, timeout=120)


@pytest.fixture()
def aclient(api):
    return openai.AsyncOpenAI(base_url=api.openai_url + "/v1", api_key="none", max_retries=0, timeout=120)


def test_chat_streamed_equals_not_streamed_and_counts_its_tokens(client, model):
    whole = client.chat.completions.create(model=model, messages=PROMPT, max_tokens=24, temperature=0)
    chunks = list(client.chat.completions.create(model=model, messages=PROMPT, max_tokens=24, temperature=0,
                                                 stream=True, logprobs=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content and text
    entries = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    tokens = len(entries)
    assert "".join(e.token for e in entries) == text
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == tokens
    assert whole.usage.completion_tokens == tokens == 24 and whole.choices[0].finish_reason == "length"


def test_completions_and_n_2(client, model):
    out = client.completions.create(model=model, prompt=["import os\n", "class A:"], max_tokens=8, n=2, seed=3,
                                    temperature=1.0)
    assert sorted(c.index for c in out.choices) == [0, 1, 2, 3] and all(c.text for c in out.choices)
    assert out.usage.completion_tokens == 32


def test_seeded_sampling_replays(client, model):
    kw = dict(model=model, messages=PROMPT, max_tokens=32, temperature=1.0, top_p=0.95, seed=1234)
    first = client.chat.completions.create(**kw).choices[0].message.content
    assert client.chat.completions.create(**kw).choices[0].message.content == first


def test_stop_is_trimmed_and_not_counted(client, model):
    full = client.completions.create(model=model, prompt="def fibonacci(n):", max_tokens=40, temperature=0)
    text = full.choices[0].text
    stop = text[len(text) // 2:len(text) // 2 + 3]
    assert stop.strip(), text
    cut = client.completions.create(model=model, prompt="def fibonacci(n):", max_tokens=40, temperature=0,
                                    stop=[stop], logprobs=0)
    choice = cut.choices[0]
    assert choice.finish_reason == "stop" and choice.text == text[:text.index(stop)]
    assert cut.usage.completion_tokens == len(choice.logprobs.token_logprobs) < 40


def test_top_logprobs_3_rank_the_greedy_token_first(client, model):
    out = client.chat.completions.create(model=model, messages=PROMPT, max_tokens=12, temperature=0,
                                         logprobs=True, top_logprobs=3)
    entries = out.choices[0].logprobs.content
    assert len(entries) == out.usage.completion_tokens == 12
    for e in entries:
        lps = [a.logprob for a in e.top_logprobs]
        assert len(lps) == 3 and lps == sorted(lps, reverse=True) and lps[0] <= 0
        assert e.logprob == pytest.approx(lps[0], abs=1e-5)     # greedy: the chosen token is the most likely
    comp = client.completions.create(model=model, prompt="def fibonacci(n):", max_tokens=6, temperature=0,
                                     logprobs=2)
    assert [len(t) for t in comp.choices[0].logprobs.top_logprobs] == [2] * 6


@pytest.mark.parametrize("name", list(SCHEMAS)[:10])
def test_json_schema_output_is_valid_at_temperature_1(client, model, name):
    schema = SCHEMAS[name]
    out = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "a record"}],
                                         max_tokens=200, temperature=1.0, seed=11,
                                         response_format={"type": "json_schema",
                                                          "json_schema": {"name": name, "schema": schema}})
    choice = out.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    jsonschema.validate(json.loads(choice.message.content), schema)


WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                     "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"], "additionalProperties": False}}}
CLOCK = {"type": "function", "function": {"name": "clock", "parameters": {
    "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
    "additionalProperties": False}}}


def test_named_and_required_tool_calls_validate(client, model):
    named = client.chat.completions.create(model=model, messages=PROMPT, max_tokens=64, temperature=1.0, seed=5,
                                           tools=[WEATHER, CLOCK],
                                           tool_choice={"type": "function", "function": {"name": "weather"}})
    call = named.choices[0].message.tool_calls[0]
    assert call.function.name == "weather" and named.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
    chunks = list(client.chat.completions.create(model=model, messages=PROMPT, max_tokens=64, temperature=1.0,
                                                 seed=6, tools=[WEATHER, CLOCK], tool_choice="required", stream=True))
    calls = [tc for c in chunks for ch in c.choices for tc in (ch.delta.tool_calls or [])]
    name = calls[0].function.name
    tool = {"weather": WEATHER, "clock": CLOCK}[name]
    jsonschema.validate(json.loads("".join(tc.function.arguments for tc in calls)), tool["function"]["parameters"])
    assert [ch.finish_reason for c in chunks for ch in c.choices if ch.finish_reason] == ["tool_calls"]


def test_auto_tool_choice_is_served_under_its_structural_tag(client, model):
    """The ensemble compiles the auto guide (free text, calls under the tools' schemas); the demo model
    writes code, not calls, so the answer is content (parsing calls: tests/gateway/test_openai_api.py)."""
    weather = {"type": "function", "function": {"name": "weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    out = client.chat.completions.create(model=model, messages=PROMPT, max_tokens=16, temperature=0,
                                         tools=[weather])
    choice = out.choices[0]
    assert choice.finish_reason in ("stop", "length", "tool_calls") and (choice.message.content or choice.message.tool_calls)
    for call in choice.message.tool_calls or []:
        jsonschema.validate(json.loads(call.function.arguments), weather["function"]["parameters"])


def test_bad_inputs_get_openai_errors(client, model):
    cases = [(dict(temperature=-1), 400, "temperature"), (dict(n=0), 400, "n"),
             (dict(extra_body={"best_of": 2}), 400, "best_of"), (dict(max_tokens=0), 400, "max_tokens")]
    for kw, status, param in cases:
        with pytest.raises(openai.APIStatusError) as e:
            client.chat.completions.create(model=model, messages=PROMPT, **kw)
        assert e.value.status_code == status and e.value.body["param"] == param, kw
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="no-such-model", messages=PROMPT)
    assert e.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as e:   # the ensemble's own check: a prompt over the context
        client.completions.create(model=model, prompt="x " * 5000, max_tokens=4)
    assert e.value.body["param"] == "prompt"


EOS_PROMPT = "if __name__ == '__main__':\n    main()\n"   # the demo model's greedy answer is EOS at once


@pytest.fixture(scope="module")
def tokenizer(model_path):
    from preprocess.tokenizer import load_tokenizer

    return load_tokenizer(model_path)


def test_ignore_eos_gives_exactly_max_tokens(client, model):
    """vLLM's extra as load generators send it (``extra_body``): a completion that EOS ends at once, and chat,
    streamed and not, each have exactly ``max_tokens`` tokens."""
    early = client.completions.create(model=model, prompt=EOS_PROMPT, max_tokens=24, temperature=0)
    assert early.choices[0].finish_reason == "stop" and early.usage.completion_tokens < 24
    fixed = client.completions.create(model=model, prompt=EOS_PROMPT, max_tokens=24, temperature=0,
                                      extra_body={"ignore_eos": True})
    assert fixed.choices[0].finish_reason == "length" and fixed.usage.completion_tokens == 24
    for n_tokens, stream in ((40, False), (33, True)):
        kw = dict(model=model, messages=PROMPT, max_tokens=n_tokens, temperature=1.0, seed=5,
                  extra_body={"ignore_eos": True})
        if stream:
            chunks = list(client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
            usage, finish = chunks[-1].usage, [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        else:
            out = client.chat.completions.create(**kw)
            usage, finish = out.usage, out.choices[0].finish_reason
        assert finish == "length" and usage.completion_tokens == n_tokens


WORDS = (" return", " import", " class")   # one token each in the demo tokenizer


def test_logit_bias_forces_and_bans_a_greedy_token(client, model, tokenizer):
    ids = [tokenizer.encode(w, add_special_tokens=False) for w in WORDS]
    assert all(len(i) == 1 for i in ids), ids
    ids = [i[0] for i in ids]

    def words(bias: dict) -> list[str]:
        out = client.completions.create(model=model, prompt="def fibonacci(n):", max_tokens=6, temperature=0,
                                        logit_bias={str(t): b for t, b in bias.items()})
        return out.choices[0].text.split(" ")[1:]

    assert words({ids[0]: 100}) == ["return"] * 6                       # +100 makes the greedy request emit it
    three = words({t: 100 for t in ids})
    assert three and set(three) <= {w.strip() for w in WORDS}, three
    first = WORDS.index(" " + three[0])                                  # the one of three the model prefers
    banned = words({t: -100 if i == first else 100 for i, t in enumerate(ids)})
    assert banned and WORDS[first].strip() not in banned and set(banned) <= {w.strip() for w in WORDS}, banned
    chat = client.chat.completions.create(model=model, messages=PROMPT, max_tokens=4, temperature=0,
                                          logit_bias={str(ids[2]): 100})
    assert chat.choices[0].message.content == " class" * 4


@pytest.mark.parametrize("kw, param, message", [
    (dict(logit_bias={"5": 101}), "logit_bias", "logit_bias: the bias of token 5 must be in [-100, 100], got 101"),
    (dict(logit_bias={"99999": 1}), "logit_bias", "logit_bias: token id 99999 is outside the vocabulary [0, 4096)"),
    (dict(logit_bias={"x": 1}), "logit_bias", "logit_bias: key 'x' is not a token id (a decimal integer)"),
    (dict(response_format={"type": "json_object"}, extra_body={"ignore_eos": True}), "ignore_eos",
     "ignore_eos: not supported with guided decoding (the grammar ends with EOS)"),
])
def test_a_bad_logit_bias_or_ignore_eos_is_a_400_naming_it(client, model, kw, param, message):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, messages=PROMPT, max_tokens=4, **kw)
    assert e.value.body["param"] == param and e.value.body["message"] == message


def test_32_concurrent_streams_complete(aclient, model):
    async def one(i: int) -> int:
        stream = await aclient.chat.completions.create(model=model, messages=PROMPT, max_tokens=16, seed=i,
                                                       temperature=1.0, stream=True,
                                                       stream_options={"include_usage": True})
        usage = None
        async for chunk in stream:
            usage = chunk.usage or usage
        return usage.completion_tokens

    async def all_of():
        return await asyncio.gather(*(one(i) for i in range(32)))
    counts = asyncio.run(all_of())
    assert len(counts) == 32 and all(0 < c <= 16 for c in counts)


def test_metrics_on_the_openai_port_are_the_engines(api, server):
    served = metrics(api.openai_url + "/metrics")
    direct = metrics(server.metrics_url)
    for name, label, value in (("nv_trt_llm_request_metrics", "request_type", "waiting"),
                               ("nv_trt_llm_request_metrics", "request_type", "scheduled"),
                               ("nv_trt_llm_kv_cache_block_metrics", "kv_cache_block_type", "max"),
                               ("nv_trt_llm_kv_cache_block_metrics", "kv_cache_block_type", "tokens_per")):
        keys = [k for k in served if k[0] == name and (label, value) in k[1]]
        assert keys, f"{name}{{{label}={value!r}}} missing"
        assert served[keys[0]] == direct[keys[0]]


def test_schema_fuzzer_finds_no_server_error_and_no_hang(api, model):
    """schemathesis' cases for the generation routes (tests/gateway/test_openai_fuzz.py runs more against a
    fake), with the served model's name and small ``n`` / ``max_tokens`` so that each case stays short."""
    import schemathesis
    from hypothesis import HealthCheck, given, settings
    from schemathesis.checks import not_a_server_error

    schema = schemathesis.openapi.from_url(api.openai_url + "/openapi.json")
    ops = [r.ok() for r in schema.get_all_operations() if r.ok().method.upper() == "POST"]
    assert {op.path for op in ops} == {"/v1/chat/completions", "/v1/completions"}
    for op in ops:
        @given(case=op.as_strategy())
        @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def run(case):
            if isinstance(case.body, dict):
                case.body["model"] = model
                for key, cap in (("n", 2), ("max_tokens", 32), ("max_completion_tokens", 32), ("min_tokens", 8)):
                    if isinstance(case.body.get(key), int):
                        case.body[key] = min(case.body[key], cap)
            response = case.call(base_url=api.openai_url, timeout=30)
            case.validate_response(response, checks=[not_a_server_error])
        run()


def test_model_names_a_lora_adapter(client, model, server):
    """`/v1/models` lists the adapters beside the base model; `model` set to one runs under it, as the ensemble's
    `lora_name` does."""
    from tests.e2e.helpers import run

    ids = [m.id for m in client.models.list().data]
    assert ids[0] == model and {"qv8", "all4", "mlp16"} <= set(ids)
    got = client.completions.create(model="qv8", prompt="def f(x):", max_tokens=8, temperature=0).choices[0].text
    base = client.completions.create(model=model, prompt="def f(x):", max_tokens=8, temperature=0).choices[0].text
    direct = run(server.grpc_url, "def f(x):", 8, temperature=0.0, lora_name="qv8", exclude_input_in_output=True)
    assert got == direct.text and got != base
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="x", max_tokens=2)
