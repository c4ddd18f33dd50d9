"""Field, response and error mapping between triton_llm.v1 and the ensemble (gateway/mapping.py), no server."""
from __future__ import annotations

import math
import re
import struct

import grpc
import pytest

from gateway import mapping
from gateway.config import REPO
from tests.gateway.fake_triton import decode_input, empty_final, inputs_of, response
from triton_llm.v1 import llm_service_pb2 as pb

PROTO = REPO / "proto" / "triton_llm" / "v1" / "llm_service.proto"
ENSEMBLE_CONFIG = REPO / "model_repository" / "ensemble" / "config.pbtxt"
NOT_EXPOSED = {"stop": "TensorRT-LLM's cancel flag: a gRPC cancellation or deadline does this",
               "min_length": "an alias of min_tokens",
               "lora_task_id": "TensorRT-LLM's LoRA tensors: the typed API names an adapter (lora_name)",
               "lora_weights": "TensorRT-LLM's LoRA tensors", "lora_config": "TensorRT-LLM's LoRA tensors"}
_TYPES = {"TYPE_STRING": "BYTES", "TYPE_INT32": "INT32", "TYPE_FP32": "FP32", "TYPE_BOOL": "BOOL",
          "TYPE_UINT64": "UINT64", "TYPE_FP16": "FP16"}


def ensemble_inputs() -> dict[str, str]:
    text = ENSEMBLE_CONFIG.read_text()
    block = text[text.index("input ["):text.index("output [")]
    return {n: _TYPES[t] for n, t in re.findall(r'name:\s*"(\w+)"\s+data_type:\s*(TYPE_\w+)', block)}


def everything_set(**input_case) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        max_tokens=8, stream=True, temperature=0.5, top_p=0.9, top_k=5, min_p=0.1, repetition_penalty=1.1,
        presence_penalty=0.2, frequency_penalty=-0.3, seed=2**64 - 1, stop_words=["\n\n", "END"],
        bad_words=["foo"], end_id=7, pad_id=2, min_tokens=1, num_return_sequences=2, beam_width=1,
        exclude_input_in_output=True, return_log_probs=True, return_num_input_tokens=True,
        return_num_output_tokens=True, skip_special_tokens=False, include_stop_str_in_output=True,
        guided_decoding=pb.GuidedDecoding(json_schema='{"type": "object"}'), request_id="req-1",
        num_speculative_tokens=2, top_logprobs=3, lora_name="sql", ignore_eos=True,
        logit_bias={17: 2.5, 5: -100.0}, **input_case)


def sent(request: pb.GenerateRequest) -> dict[str, tuple[str, list]]:
    req = mapping.build_infer_request(request, "rid")
    return {name: (dtype, decode_input(dtype, raw)) for name, (dtype, _, raw) in inputs_of(req).items()}


def test_every_ensemble_input_is_reachable_with_the_ensemble_type():
    expected = ensemble_inputs()
    assert len(expected) >= 25 and "text_input" in expected  # a parse that silently found nothing fails
    got = {**sent(everything_set(prompt="p")), **sent(everything_set(messages=pb.ChatMessages(
        messages=[pb.ChatMessage(role="user", content="x")])))}
    missing = set(expected) - set(got) - set(NOT_EXPOSED)
    assert not missing, f"ensemble inputs with no proto field: {sorted(missing)}"
    assert set(got) <= set(expected)
    for name, (dtype, _) in got.items():
        assert dtype == expected[name], name


def test_values_are_encoded_as_the_ensemble_expects():
    got = sent(everything_set(prompt="def f(): é"))
    assert got["text_input"] == ("BYTES", ["def f(): é"])
    assert got["max_tokens"] == ("INT32", [8])
    assert got["temperature"][1][0] == pytest.approx(0.5) and got["frequency_penalty"][1][0] == pytest.approx(-0.3)
    assert got["seed"] == ("UINT64", [2**64 - 1])
    assert got["stop_words"] == ("BYTES", ["\n\n", "END"])
    assert got["stream"] == ("BOOL", [True]) and got["skip_special_tokens"] == ("BOOL", [False])
    assert got["guided_decoding_guide_type"] == ("BYTES", ["json_schema"])
    assert got["guided_decoding_guide"] == ("BYTES", ['{"type": "object"}'])
    assert got["ignore_eos"] == ("BOOL", [True])
    assert got["logit_bias"] == ("BYTES", ['{"5": -100.0, "17": 2.5}'])     # the ensemble's JSON, ids in order
    req = mapping.build_infer_request(everything_set(prompt="x"), "rid-9", model="ens2")
    assert (req.model_name, req.id) == ("ens2", "rid-9")
    assert req.parameters["triton_enable_empty_final_response"].bool_param
    for t in req.inputs:
        assert t.shape[0] == 1 and len(t.shape) == 2  # batch of one, as the ensemble (max_batch_size 64) wants


def test_unset_options_are_not_sent_so_the_ensemble_defaults_apply():
    got = sent(pb.GenerateRequest(prompt="x", max_tokens=3))
    assert set(got) == {"text_input", "max_tokens", "return_perf_metrics"}   # the last one feeds Usage
    # Explicit zero values are sent (presence tracking): temperature=0 means greedy, not "default".
    got = sent(pb.GenerateRequest(prompt="x", max_tokens=3, temperature=0.0, top_k=0, stream=False))
    assert got["temperature"] == ("FP32", [0.0]) and got["top_k"] == ("INT32", [0]) and got["stream"] == ("BOOL", [False])


def test_messages_become_the_messages_json_and_an_empty_text_input():
    import json

    got = sent(pb.GenerateRequest(max_tokens=3, messages=pb.ChatMessages(messages=[
        pb.ChatMessage(role="system", content="be brief"), pb.ChatMessage(role="user", content="hï")])))
    assert got["text_input"] == ("BYTES", [""])
    assert json.loads(got["messages"][1][0]) == [{"role": "system", "content": "be brief"},
                                                 {"role": "user", "content": "hï"}]


@pytest.mark.parametrize("guide, kind, text", [
    (pb.GuidedDecoding(json_schema="{}"), "json_schema", "{}"),
    (pb.GuidedDecoding(any_json=pb.GuidedDecoding.AnyJson()), "json", ""),
    (pb.GuidedDecoding(regex="[a-z]+"), "regex", "[a-z]+"),
    (pb.GuidedDecoding(ebnf_grammar='root ::= "a"'), "ebnf_grammar", 'root ::= "a"'),
])
def test_guided_decoding_cases_map_to_guide_type_and_guide(guide, kind, text):
    got = sent(pb.GenerateRequest(prompt="x", max_tokens=3, guided_decoding=guide))
    assert got["guided_decoding_guide_type"] == ("BYTES", [kind])
    assert got["guided_decoding_guide"] == ("BYTES", [text])


@pytest.mark.parametrize("request_, field", [
    (pb.GenerateRequest(max_tokens=3), "prompt"),
    (pb.GenerateRequest(prompt="x", max_tokens=3, guided_decoding=pb.GuidedDecoding()), "guided_decoding"),
])
def test_gateway_side_field_errors(request_, field):
    with pytest.raises(mapping.FieldError) as e:
        mapping.build_infer_request(request_, "rid")
    assert e.value.field == field and str(e.value).startswith(f"{field}: ")


@pytest.mark.parametrize("rid, ok", [("abc-123_X.y", True), ("x" * 128, True), ("x" * 129, False),
                                     ("has space", False), ("tab\t", False), ("é", False), ("a\nb", False)])
def test_request_id_validation(rid, ok):
    if ok:
        mapping.validate_request_id(rid)
    else:
        with pytest.raises(mapping.FieldError, match="^request_id: "):
            mapping.validate_request_id(rid)


# ---- defaults documented in the proto agree with docs/api.md --------------------------------------------

def _proto_field_comments(message: str) -> dict[str, str]:
    text = PROTO.read_text()
    body = text[text.index(f"message {message} {{"):]
    out, comment = {}, []
    for line in body.splitlines()[1:]:
        s = line.strip()
        if s.startswith("//"):
            comment.append(s[2:].strip())
        elif re.match(r"(optional |repeated )?[\w.]+ \w+ = \d+;", s):
            out[s.split("=")[0].split()[-1]] = " ".join(comment)
            comment = []
        elif s == "}" and line.startswith("}"):
            break
        elif not s.startswith("oneof"):
            comment = []
    return out


def _docs_defaults() -> dict[str, str]:
    out = {}
    for line in (REPO / "docs" / "api.md").read_text().splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) > 4 and re.fullmatch(r"`\w+`", cells[1]):
            out[cells[1].strip("`")] = cells[3]
    return out


def _norm(value: str) -> str:
    m = re.match(r"`([^`]*)`", value)
    v = (m.group(1) if m else value.split()[0]).strip().rstrip(".,;:").lower()
    if v in ("[]", "none", '""'):
        return "none"
    try:
        return repr(float(v))
    except ValueError:
        return v


def test_proto_defaults_match_the_ensemble_defaults_in_docs_api():
    comments = _proto_field_comments("GenerateRequest")
    docs = _docs_defaults()
    checked = 0
    for fname, (input_name, _) in {**mapping.OPTIONAL_SCALARS, **{f: (n, "") for f, n in mapping.LIST_FIELDS.items()}}.items():
        m = re.search(r"Default:? (\S+(?: \(\w+\))?)", comments[fname])
        assert m, f"{fname}: no 'Default ...' in its comment: {comments[fname]!r}"
        assert _norm(m.group(1)) == _norm(docs[input_name]), (fname, m.group(1), docs[input_name])
        checked += 1
    assert checked == len(mapping.OPTIONAL_SCALARS) + len(mapping.LIST_FIELDS) == 26


# ---- responses ----------------------------------------------------------------------------------------

def feed(responses, rid="r1"):
    a = mapping.ResponseAssembler(rid)
    out = []
    for r in responses:
        assert not a.finished
        msg = a.on_response(r.infer_response)
        if msg is not None:
            out.append(msg)
    return a, out


def test_deltas_finish_reason_and_usage_on_the_last_message():
    a, out = feed([response("def", n_in=5, n_out=1), response(" f():", n_in=5, n_out=4),
                   response("\n", finish="stop", n_in=5, n_out=6, final=True)])
    assert a.finished
    assert "".join(m.text for m in out) == "def f():\n"
    assert [m.finish_reason for m in out] == [pb.FINISH_REASON_UNSPECIFIED] * 2 + [pb.FINISH_REASON_STOP]
    assert [m.HasField("usage") for m in out] == [False, False, True]
    assert out[-1].usage == pb.Usage(prompt_tokens=5, completion_tokens=6, total_tokens=11)
    assert [m.num_output_tokens for m in out] == [1, 4, 6]
    assert all(m.request_id == "r1" for m in out)


def test_an_empty_final_response_still_brings_the_usage():
    a, out = feed([response("abc", finish="length", n_in=3, n_out=2), empty_final()])
    assert a.finished and len(out) == 2
    assert out[-1].text == "" and out[-1].usage.completion_tokens == 2 and out[-1].usage.prompt_tokens == 3


def test_usage_sums_sequences():
    a, out = feed([response("a", seq=0, n_in=4, n_out=1), response("b", seq=1, n_in=4, n_out=1),
                   response("aa", seq=0, n_in=4, n_out=3, finish="length"),
                   response("bb", seq=1, n_in=4, n_out=2, finish="stop", final=True)])
    assert [m.sequence_index for m in out] == [0, 1, 0, 1]
    assert out[2].finish_reason == pb.FINISH_REASON_LENGTH and out[3].finish_reason == pb.FINISH_REASON_STOP
    assert out[-1].usage.completion_tokens == 5 and out[-1].usage.total_tokens == 9


@pytest.mark.parametrize("reason, expected", [("stop", pb.FINISH_REASON_STOP), ("length", pb.FINISH_REASON_LENGTH),
                                              ("abort", pb.FINISH_REASON_ABORT),
                                              ("cancelled", pb.FINISH_REASON_ABORT),
                                              ("", pb.FINISH_REASON_UNSPECIFIED)])
def test_finish_reasons(reason, expected):
    _, out = feed([response("x", finish=reason, final=True)])
    assert out[0].finish_reason == expected


def test_engine_error_finish_reason_is_internal():
    with pytest.raises(mapping.UpstreamError) as e:
        feed([response("x", finish="error", final=True)])
    assert e.value.code == grpc.StatusCode.INTERNAL


def test_log_probs_only_when_returned():
    _, out = feed([response("ab", logprobs=[-0.5, -1.25], cum=-1.75, n_out=2, final=True)])
    assert list(out[0].log_probs) == [-0.5, -1.25] and out[0].cum_log_prob == pytest.approx(-1.75)
    _, out = feed([response("ab", n_out=2, final=True)])
    assert not out[0].log_probs and not out[0].HasField("cum_log_prob")


def test_draft_token_outputs_fill_usage_when_the_ensemble_has_them():
    _, out = feed([response("x", final=True)])
    assert out[0].usage.draft_tokens == 0 and out[0].usage.accepted_draft_tokens == 0
    _, out = feed([response("x", final=True, extra={"total_draft_tokens": ("INT32", struct.pack("<i", 40)),
                                                    "total_accepted_draft_tokens": ("INT32", struct.pack("<i", 25))})])
    assert (out[0].usage.draft_tokens, out[0].usage.accepted_draft_tokens) == (40, 25)
    _, out = feed([response("x", final=True, extra={"total_draft_tokens": ("INT32", struct.pack("<i", 40)),
                                                    "acceptance_rate": ("FP32", struct.pack("<f", 0.5))})])
    assert (out[0].usage.draft_tokens, out[0].usage.accepted_draft_tokens) == (40, 20)


def test_incomplete_utf8_in_a_delta_does_not_raise():
    _, out = feed([response("é", final=True)])
    assert out[0].text == "é"


# ---- errors --------------------------------------------------------------------------------------------

PROMPT = pb.GenerateRequest(prompt="x", max_tokens=4)
CHAT = pb.GenerateRequest(max_tokens=4, messages=pb.ChatMessages(messages=[pb.ChatMessage(role="user")]))
GUIDED = pb.GenerateRequest(prompt="x", max_tokens=4, guided_decoding=pb.GuidedDecoding(regex="("))


@pytest.mark.parametrize("message, request_, field, text", [
    ("in ensemble 'ensemble', top_p: must be <= 1.0, got 2.0", PROMPT, "top_p", "top_p: must be <= 1.0, got 2.0"),
    ("in ensemble 'ensemble', max_tokens: prompt (4 tokens) + max_tokens (100000) exceeds max_model_len (1024)",
     PROMPT, "max_tokens", None),
    ("in ensemble 'ensemble', text_input: empty prompt", PROMPT, "prompt", "prompt: empty prompt"),
    ("in ensemble 'ensemble', text_input: prompt is 10001 tokens; the model's context is 1024 tokens", CHAT,
     "messages", None),
    ("in ensemble 'ensemble', messages: message 0: 'role' must be a non-empty string", CHAT, "messages", None),
    ("in ensemble 'ensemble', min_length: must equal min_tokens", PROMPT, "min_tokens", None),
    ("in ensemble 'ensemble', guided_decoding_guide: invalid regex", GUIDED, "guided_decoding.regex",
     "guided_decoding.regex: invalid regex"),
    ("in ensemble 'ensemble', guided_decoding_guide_type: guided decoding is not supported yet by this engine",
     GUIDED, "guided_decoding.regex", None),
    ("seed: must be in [0, 18446744073709551615]", PROMPT, "seed", None),
    ("in ensemble 'ensemble', logit_bias: token id 5000 is outside the vocabulary [0, 4096)", PROMPT, "logit_bias",
     "logit_bias: token id 5000 is outside the vocabulary [0, 4096)"),
    ("in ensemble 'ensemble', ignore_eos: not supported with guided decoding (the grammar ends with EOS)", GUIDED,
     "ignore_eos", None),
])
def test_ensemble_client_errors_name_the_proto_field(message, request_, field, text):
    err = mapping.map_triton_error(message, request_, "rid")
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT and err.field == field
    assert err.message.startswith(f"{field}: ")
    assert "in ensemble" not in err.message
    if text is not None:
        assert err.message == text


@pytest.mark.parametrize("message, code", [
    ("Request for unknown model: 'ensemble' is not found", grpc.StatusCode.UNAVAILABLE),
    ("Request for unknown model: 'ensemble' has no available versions", grpc.StatusCode.UNAVAILABLE),
    ("in ensemble 'ensemble', Request was cancelled", grpc.StatusCode.CANCELLED),
    ("Request timeout expired", grpc.StatusCode.DEADLINE_EXCEEDED),
])
def test_server_side_conditions(message, code):
    assert mapping.map_triton_error(message, PROMPT, "rid").code == code


def test_anything_else_is_internal_with_the_request_id_and_no_upstream_text():
    secret = ("in ensemble 'ensemble', Traceback (most recent call last):\n  File \"/srv/model.py\", line 3\n"
              "RuntimeError: CUDA out of memory at 0xdeadbeef")
    err = mapping.map_triton_error(secret, PROMPT, "req-42")
    assert err.code == grpc.StatusCode.INTERNAL and err.field is None
    assert "req-42" in err.message and "Traceback" not in err.message and "model.py" not in err.message
    # an unknown name before the colon is not taken for a field
    err = mapping.map_triton_error("weights: checksum mismatch", PROMPT, "r")
    assert err.code == grpc.StatusCode.INTERNAL


def test_rpc_errors():
    assert mapping.map_rpc_error(grpc.StatusCode.UNAVAILABLE, "connect failed", "r", "h:1").code == \
        grpc.StatusCode.UNAVAILABLE
    assert mapping.map_rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, "", "r", "h:1").code == \
        grpc.StatusCode.DEADLINE_EXCEEDED
    err = mapping.map_rpc_error(grpc.StatusCode.UNKNOWN, "stack trace here", "r7", "h:1")
    assert err.code == grpc.StatusCode.INTERNAL and "r7" in err.message and "stack" not in err.message


def test_nan_passes_through_for_preprocess_to_reject():
    got = sent(pb.GenerateRequest(prompt="x", max_tokens=3, temperature=float("nan")))
    assert math.isnan(got["temperature"][1][0])
    got = sent(pb.GenerateRequest(prompt="x", max_tokens=3, logit_bias={3: float("nan")}))
    assert got["logit_bias"] == ("BYTES", ['{"3": NaN}'])
