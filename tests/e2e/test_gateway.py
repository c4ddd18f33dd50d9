"""The typed gRPC API through the gateway (``python -m gateway``) in front of the real tritonserver.

The gateway runs as its own process (as in ``make serve`` and the Helm chart) against the session's
server. Its restart behaviour (Triton stopped and started again) is in test_gateway_restart.py.
"""
from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.e2e.helpers import clean_env, engine_idle, run, start_gateway
from triton_llm.v1 import llm_service_pb2 as pb
from triton_llm.v1 import llm_service_pb2_grpc as pb_grpc

PROMPTS = ["def fibonacci(n):", "import os\n\n\ndef main(", "class Stack:\n    def __init__(self"]
@pytest.fixture(scope="module")
def gateway(server, tmp_path_factory):
    gw = start_gateway(server, tmp_path_factory.mktemp("gateway"))
    yield gw
    code = gw.stop()
    assert code == 0, f"the gateway exited with {code}\n{gw.log_tail()}"
    warnings = [line for line in gw.log_tail(10_000).splitlines() if " WARNING " in line or " ERROR " in line]
    if warnings:  # shown with -s or on a later failure (e.g. the session server's unclean exit)
        print("\n--- gateway warnings ---\n" + "\n".join(warnings[-20:]))


@pytest.fixture(scope="module")
def stub(gateway):
    with grpc.insecure_channel(gateway.target) as ch:
        yield pb_grpc.LLMServiceStub(ch)


def generate(stub, timeout: float = 120.0, metadata=(), **fields) -> list[pb.GenerateResponse]:
    return list(stub.Generate(pb.GenerateRequest(**fields), timeout=timeout, metadata=metadata))


def rpc_error(fn) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as e:
        fn()
    return e.value


# ---- same results as the ensemble directly ----------------------------------------------------------------

@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("exclude_input", [True, False])
def test_same_text_and_usage_as_the_ensemble(server, stub, prompt, exclude_input):
    direct = run(server.grpc_url, prompt, 40, temperature=0.0, stream=True, exclude_input_in_output=exclude_input,
                 return_num_input_tokens=True, return_num_output_tokens=True)
    assert direct.error is None, direct.error
    out = generate(stub, prompt=prompt, max_tokens=40, temperature=0.0, stream=True,
                   exclude_input_in_output=exclude_input)
    assert "".join(m.text for m in out) == direct.text
    assert out[-1].HasField("usage") and not any(m.HasField("usage") for m in out[:-1])
    assert out[-1].usage.completion_tokens == direct.num_output_tokens
    assert out[-1].usage.prompt_tokens == max(c.num_input_tokens for c in direct.chunks)
    assert out[-1].usage.total_tokens == out[-1].usage.prompt_tokens + out[-1].usage.completion_tokens
    reason = {"length": pb.FINISH_REASON_LENGTH, "stop": pb.FINISH_REASON_STOP}[direct.finish_reason]
    assert out[-1].finish_reason == reason
    assert all(m.finish_reason == pb.FINISH_REASON_UNSPECIFIED for m in out[:-1])
    assert len(out) > 1  # streamed, several deltas


def test_streamed_deltas_join_to_the_one_shot_text(stub):
    streamed = generate(stub, prompt=PROMPTS[0], max_tokens=48, temperature=0.0, stream=True)
    whole = generate(stub, prompt=PROMPTS[0], max_tokens=48, temperature=0.0)  # stream defaults to false
    assert len(whole) == 1 and len(streamed) > 1
    assert "".join(m.text for m in streamed) == whole[0].text
    tokens = lambda u: (u.prompt_tokens, u.completion_tokens, u.total_tokens)  # noqa: E731
    assert tokens(whole[0].usage) == tokens(streamed[-1].usage)
    # the draft counts are the server's (adaptive n-gram speculation): they may differ run to run
    for u in (whole[0].usage, streamed[-1].usage):
        assert 0 <= u.accepted_draft_tokens <= u.draft_tokens


def test_chat_messages_stop_strings_and_seeded_sampling_match_the_ensemble(server, stub):
    msgs = [{"role": "user", "content": "Write a function that sorts a list"}]
    direct = run(server.grpc_url, "", 32, messages=msgs, temperature=0.8, seed=7, stream=True,
                 exclude_input_in_output=True, stop_words=["\n\n"])
    out = generate(stub, messages=pb.ChatMessages(messages=[pb.ChatMessage(**m) for m in msgs]), max_tokens=32,
                   temperature=0.8, seed=7, stream=True, exclude_input_in_output=True, stop_words=["\n\n"])
    assert "".join(m.text for m in out) == direct.text
    assert out[-1].usage.completion_tokens == direct.num_output_tokens


def test_log_probs_and_request_id(stub):
    out = generate(stub, prompt=PROMPTS[1], max_tokens=12, temperature=0.0, stream=True, return_log_probs=True,
                   exclude_input_in_output=True, request_id="e2e-logprobs-1")
    assert {m.request_id for m in out} == {"e2e-logprobs-1"}
    lps = [lp for m in out for lp in m.log_probs]
    assert len(lps) == out[-1].usage.completion_tokens == 12
    assert all(lp <= 0 for lp in lps)
    assert out[-1].cum_log_prob == pytest.approx(sum(lps), abs=1e-3)


def test_num_return_sequences(stub):
    out = generate(stub, prompt=PROMPTS[0], max_tokens=10, min_tokens=10, temperature=1.0, seed=3, stream=True,
                   num_return_sequences=2, exclude_input_in_output=True)
    assert {m.sequence_index for m in out} == {0, 1}
    finished = [m for m in out if m.finish_reason != pb.FINISH_REASON_UNSPECIFIED]
    assert sorted(m.sequence_index for m in finished) == [0, 1]
    assert out[-1].usage.completion_tokens == 20


def test_tokenize_and_model_info_agree_with_generate(stub, model_path):
    info = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=30)
    assert info.name == model_path.name and info.triton_model == "ensemble"
    assert info.vocab_size > 0 and info.max_context_tokens > 0 and info.architecture.endswith("ForCausalLM")
    assert info.speculative_method == pb.SPECULATIVE_METHOD_NGRAM and info.num_speculative_tokens == 8  # e2e server
    assert sorted(info.supported_guide_types) == sorted(  # the engine constrains every guide type
        [pb.GUIDE_TYPE_JSON_SCHEMA, pb.GUIDE_TYPE_ANY_JSON, pb.GUIDE_TYPE_REGEX, pb.GUIDE_TYPE_EBNF_GRAMMAR,
         pb.GUIDE_TYPE_STRUCTURAL_TAG])
    tok = stub.Tokenize(pb.TokenizeRequest(text=PROMPTS[2]), timeout=30)
    out = generate(stub, prompt=PROMPTS[2], max_tokens=2, temperature=0.0)
    assert tok.token_count == out[-1].usage.prompt_tokens
    assert tok.max_context_tokens == info.max_context_tokens
    assert list(info.lora_adapters) == ["all4", "mlp16", "qv8"]                   # the e2e server's adapters
    under = generate(stub, prompt=PROMPTS[2], max_tokens=6, temperature=0.0, lora_name="qv8")
    base = generate(stub, prompt=PROMPTS[2], max_tokens=6, temperature=0.0)
    assert "".join(m.text for m in under) != "".join(m.text for m in base)
    err = rpc_error(lambda: generate(stub, prompt=PROMPTS[2], max_tokens=2, lora_name="nope"))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "nope" in err.details()
    chat = pb.ChatMessages(messages=[pb.ChatMessage(role="user", content="hello")])
    tok = stub.Tokenize(pb.TokenizeRequest(messages=chat), timeout=30)
    out = generate(stub, messages=chat, max_tokens=2, temperature=0.0)
    assert tok.token_count == out[-1].usage.prompt_tokens


def test_ignore_eos_and_logit_bias(stub, model_path):
    """A prompt whose greedy answer is EOS at once: with ``ignore_eos`` it has ``max_tokens`` tokens. +100 on a
    token makes a greedy request emit only it; -100 on it then keeps it out."""
    from preprocess.tokenizer import load_tokenizer

    eos_prompt = "if __name__ == '__main__':\n    main()\n"
    early = generate(stub, prompt=eos_prompt, max_tokens=16, temperature=0.0)
    assert early[-1].finish_reason == pb.FINISH_REASON_STOP and early[-1].usage.completion_tokens < 16
    fixed = generate(stub, prompt=eos_prompt, max_tokens=16, temperature=0.0, ignore_eos=True)
    assert fixed[-1].finish_reason == pb.FINISH_REASON_LENGTH and fixed[-1].usage.completion_tokens == 16
    ret, = load_tokenizer(model_path).encode(" return", add_special_tokens=False)
    forced = generate(stub, prompt=PROMPTS[0], max_tokens=5, temperature=0.0, exclude_input_in_output=True,
                      logit_bias={ret: 100.0})
    assert "".join(m.text for m in forced) == " return" * 5
    plain = generate(stub, prompt="def f():\n   ", max_tokens=1, temperature=0.0, exclude_input_in_output=True)
    assert "".join(m.text for m in plain) == " return"                  # the model's own choice there
    banned = generate(stub, prompt="def f():\n   ", max_tokens=8, temperature=0.0, exclude_input_in_output=True,
                      logit_bias={ret: -100.0})
    assert "return" not in "".join(m.text for m in banned)


# ---- deadlines and cancellation free the KV cache: tests/e2e/test_cancel.py (a server whose steps are paced) ----

# ---- invalid fields ------------------------------------------------------------------------------------------

def chat(*messages) -> pb.ChatMessages:
    return pb.ChatMessages(messages=[pb.ChatMessage(role=r, content=c) for r, c in messages])


P = dict(prompt="def f():", max_tokens=4)
INVALID = {
    "no input": (dict(max_tokens=4), "prompt"),
    "empty prompt": (dict(prompt="", max_tokens=4), "prompt"),
    "prompt longer than the context": (dict(prompt="a = 1\n" * 2000, max_tokens=4), "prompt"),
    "max_tokens unset": (dict(prompt="def f():"), "max_tokens"),
    "max_tokens < 0": (dict(prompt="def f():", max_tokens=-3), "max_tokens"),
    "max_tokens beyond the context": (dict(prompt="def f():", max_tokens=100_000), "max_tokens"),
    "temperature < 0": ({**P, "temperature": -1.0}, "temperature"),
    "temperature NaN": ({**P, "temperature": float("nan")}, "temperature"),
    "top_p = 0": ({**P, "top_p": 0.0}, "top_p"),
    "top_p = 2": ({**P, "top_p": 2.0}, "top_p"),
    "top_k < 0": ({**P, "top_k": -1}, "top_k"),
    "min_p = 1.5": ({**P, "min_p": 1.5}, "min_p"),
    "repetition_penalty = 0": ({**P, "repetition_penalty": 0.0}, "repetition_penalty"),
    "presence_penalty = 3": ({**P, "presence_penalty": 3.0}, "presence_penalty"),
    "frequency_penalty = inf": ({**P, "frequency_penalty": float("inf")}, "frequency_penalty"),
    "min_tokens > max_tokens": ({**P, "min_tokens": 9}, "min_tokens"),
    "num_return_sequences = 0": ({**P, "num_return_sequences": 0}, "num_return_sequences"),
    "beam_width = 4": ({**P, "beam_width": 4}, "beam_width"),
    "empty stop word": ({**P, "stop_words": ["", "x"]}, "stop_words"),
    "empty bad word": ({**P, "bad_words": [""]}, "bad_words"),
    "end_id outside the vocabulary": ({**P, "end_id": 10**6}, "end_id"),
    "no messages": (dict(messages=chat(), max_tokens=4), "messages"),
    "message without a role": (dict(messages=chat(("", "hi")), max_tokens=4), "messages"),
    "guide without a case": ({**P, "guided_decoding": pb.GuidedDecoding()}, "guided_decoding"),
    "bad JSON schema": ({**P, "guided_decoding": pb.GuidedDecoding(json_schema="{not json")},
                        "guided_decoding.json_schema"),
    "empty regex": ({**P, "guided_decoding": pb.GuidedDecoding(regex="")}, "guided_decoding.regex"),
    "a regex that does not parse": (
        {**P, "guided_decoding": pb.GuidedDecoding(regex="[0-9")}, "guided_decoding.regex"),
    "request_id too long": ({**P, "request_id": "r" * 129}, "request_id"),
    "logit_bias outside the vocabulary": ({**P, "logit_bias": {10**6: 1.0}}, "logit_bias"),
    "logit_bias above 100": ({**P, "logit_bias": {5: 100.5}}, "logit_bias"),
    "logit_bias negative id": ({**P, "logit_bias": {-1: 1.0}}, "logit_bias"),
    "ignore_eos with a guide": ({**P, "ignore_eos": True, "guided_decoding": pb.GuidedDecoding(regex="[0-9]+")},
                                "ignore_eos"),
}


def test_at_least_fifteen_invalid_fields():
    assert len({field for _, field in INVALID.values()}) >= 15


@pytest.mark.parametrize("case", sorted(INVALID))
def test_invalid_field_is_invalid_argument_naming_it(stub, case):
    from google.rpc import error_details_pb2, status_pb2

    fields, field = INVALID[case]
    err = rpc_error(lambda: generate(stub, timeout=30, **fields))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, f"{case}: {err.code()} {err.details()}"
    assert err.details().startswith(f"{field}: "), f"{case}: {err.details()!r} does not start with {field!r}"
    assert "in ensemble" not in err.details()
    details = dict(err.trailing_metadata()).get("grpc-status-details-bin")
    status = status_pb2.Status.FromString(details)
    bad = error_details_pb2.BadRequest()
    assert status.details[0].Unpack(bad) and bad.field_violations[0].field == field


def test_gateway_keeps_serving_after_invalid_requests(server, stub, gateway):
    for fields, _ in INVALID.values():
        assert rpc_error(lambda: generate(stub, timeout=30, **fields)).code() == grpc.StatusCode.INVALID_ARGUMENT
    out = generate(stub, prompt="def f():", max_tokens=4, temperature=0.0)
    assert out[-1].usage.completion_tokens >= 1
    assert gateway.health() == "SERVING"
    engine_idle(server.metrics_url, "the invalid requests")


# ---- auth -----------------------------------------------------------------------------------------------------

def test_auth_with_a_token_file_from_the_environment(server, tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text("# as a Kubernetes secret would mount it\nsecret-token-1\n")
    gw = start_gateway(server, tmp_path, env=clean_env(GATEWAY_AUTH_TOKEN_FILE=str(tokens)))
    try:
        assert gw.health() == "SERVING"  # health needs no token
        with grpc.insecure_channel(gw.target) as ch:
            stub = pb_grpc.LLMServiceStub(ch)
            for md in [(), (("authorization", "Bearer wrong-token"),)]:
                err = rpc_error(lambda: generate(stub, metadata=md, **P))
                assert err.code() == grpc.StatusCode.UNAUTHENTICATED
                err = rpc_error(lambda: stub.GetModelInfo(pb.GetModelInfoRequest(), metadata=md, timeout=10))
                assert err.code() == grpc.StatusCode.UNAUTHENTICATED
            out = generate(stub, metadata=(("authorization", "Bearer secret-token-1"),), temperature=0.0, **P)
            assert out[-1].usage.completion_tokens >= 1
            status = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(
                service="triton_llm.v1.LLMService"), timeout=5)
            assert status.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        assert gw.stop() == 0


# ---- load and reflection ---------------------------------------------------------------------------------------

def test_64_concurrent_streams(server, gateway):
    n, max_tokens = 64, 16
    prompts = [f"def f{i}(x):\n    return x {'+-*/%'[i % 5]} {i}\n\n\ndef" for i in range(n)]

    async def one(stub, prompt):
        req = pb.GenerateRequest(prompt=prompt, max_tokens=max_tokens, min_tokens=max_tokens, temperature=0.0,
                                 stream=True, exclude_input_in_output=True)
        return [m async for m in stub.Generate(req, timeout=240)]

    async def all_streams():
        async with grpc.aio.insecure_channel(gateway.target) as ch:
            stub = pb_grpc.LLMServiceStub(ch)
            return await asyncio.gather(*(one(stub, p) for p in prompts), return_exceptions=True)

    results = asyncio.run(all_streams())
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, errors[:3]
    for i, out in enumerate(results):
        assert out[-1].finish_reason == pb.FINISH_REASON_LENGTH, i
        assert out[-1].usage.completion_tokens == max_tokens, i
    for i in (0, 33, 63):  # each equals the same request alone, straight to the ensemble
        alone = run(server.grpc_url, prompts[i], max_tokens, min_tokens=max_tokens, temperature=0.0,
                    exclude_input_in_output=True)
        assert "".join(m.text for m in results[i]) == alone.text, i
    engine_idle(server.metrics_url, "64 streams")


def test_reflection_lists_the_service_and_its_methods(gateway):
    from google.protobuf.descriptor_pool import DescriptorPool
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

    with grpc.insecure_channel(gateway.target) as ch:
        db = ProtoReflectionDescriptorDatabase(ch)
        services = db.get_services()
        assert "triton_llm.v1.LLMService" in services and "grpc.health.v1.Health" in services
        svc = DescriptorPool(db).FindServiceByName("triton_llm.v1.LLMService")
        assert [m.name for m in svc.methods] == ["Generate", "Tokenize", "GetModelInfo"]
        assert svc.methods_by_name["Generate"].output_type.full_name == "triton_llm.v1.GenerateResponse"
