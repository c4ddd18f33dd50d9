"""Hypothesis strategies for hostile ``GenerateRequest``s (the gateway's gRPC API) and OpenAI request bodies:
NaN and infinite floats, extreme integers, empty, huge and odd strings, hostile guides (tests/helpers/fuzz_inputs.py),
thousands of stop words. Used in process (tests/gateway/test_fuzz_mapping.py) and live (tests/e2e/test_fuzz_live.py).
"""
from __future__ import annotations

from hypothesis import strategies as st

from tests.helpers.fuzz_inputs import NASTY_GUIDES, PROMPTS
from triton_llm.v1 import llm_service_pb2 as pb

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
    "bad_words": st.lists(TEXT, max_size=3), "guided_decoding": GUIDED, "ignore_eos": st.booleans(),
    "logit_bias": st.dictionaries(st.one_of(INT32, st.integers(0, 5000)), FLOAT, max_size=3)
    | st.integers(1_020, 1_030).map(lambda n: {i: 1.0 for i in range(n)}),
}


@st.composite
def generate_requests(draw, live: bool = False) -> pb.GenerateRequest:
    """``live``: a valid ``max_tokens`` or ``min_tokens`` over 8 becomes 8 (cheap to serve)."""
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
        elif isinstance(value, dict):
            getattr(req, name).update(value)
        elif name == "guided_decoding":
            req.guided_decoding.CopyFrom(value)
        else:
            setattr(req, name, value)
    if live:
        for name in ("max_tokens", "min_tokens"):
            if 8 < getattr(req, name) < 1_000_000:
                setattr(req, name, 8)
    return req


PROTO_FIELDS = set(pb.GenerateRequest.DESCRIPTOR.fields_by_name) | {
    f"guided_decoding.{f}" for f in pb.GuidedDecoding.DESCRIPTOR.fields_by_name}


# ---- OpenAI bodies ---------------------------------------------------------------------------------------------

THOUSANDS = st.sampled_from((65, 2_000)).map(lambda n: [f"w{i}" for i in range(n)])
ODD_TEXT = st.one_of(st.text(max_size=24), st.sampled_from(["", " ", "\u0000", "\ud800", "x" * 200_000]))
HOSTILE = st.one_of(st.none(), st.booleans(), st.sampled_from([0, -1, 2**31, 10**30, 1.5, float("nan"),
                                                               float("inf"), "5", [], {}]), ODD_TEXT)
SMALL = st.integers(1, 4)
RESPONSE_FORMATS = st.one_of(
    st.sampled_from([{"type": "json_object"}, {"type": "text"}, {"type": "xml"}, {"type": "json_schema"},
                     {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}]),
    st.sampled_from(NASTY_GUIDES).map(lambda g: {"type": "json_schema", "json_schema": {"name": "g", "schema": g}}),
    HOSTILE)
SAMPLING_VALUES = {
    "max_tokens": st.one_of(SMALL, HOSTILE), "temperature": st.one_of(st.floats(-1, 3), HOSTILE),
    "top_p": st.one_of(st.floats(0, 1.5), HOSTILE), "n": st.one_of(st.integers(1, 2), st.sampled_from([0, 65, 129])),
    "seed": st.one_of(st.integers(-1, 2**64), HOSTILE), "stop": st.one_of(ODD_TEXT, st.lists(ODD_TEXT, max_size=3),
                                                                          THOUSANDS, HOSTILE),
    "presence_penalty": st.one_of(st.floats(-3, 3), HOSTILE), "stream": st.one_of(st.booleans(), HOSTILE),
    "top_k": st.one_of(st.integers(-2, 50), HOSTILE), "min_p": st.one_of(st.floats(0, 1.2), HOSTILE),
    "min_tokens": st.one_of(st.integers(0, 4), HOSTILE), "logit_bias": st.one_of(
        st.dictionaries(st.one_of(st.integers(-2, 5000).map(str), ODD_TEXT, st.just("1" * 40)),
                        st.one_of(st.floats(-150, 150), HOSTILE), max_size=3), HOSTILE),
    "ignore_eos": st.one_of(st.booleans(), HOSTILE),
    "repetition_penalty": st.one_of(st.floats(0, 3), HOSTILE), "user": ODD_TEXT, "best_of": HOSTILE,
    "not_a_parameter": HOSTILE,
}
CHAT_VALUES = {**SAMPLING_VALUES, "response_format": RESPONSE_FORMATS, "logprobs": st.one_of(st.booleans(), HOSTILE),
               "max_completion_tokens": st.one_of(SMALL, HOSTILE), "tools": HOSTILE, "tool_choice": HOSTILE}
CONTENT = st.one_of(st.sampled_from(PROMPTS), ODD_TEXT, st.just([{"type": "text", "text": "hi"}]), HOSTILE)
MESSAGE = st.fixed_dictionaries({"role": st.one_of(st.sampled_from(["user", "system", "assistant"]), HOSTILE),
                                 "content": CONTENT})
CHAT_MESSAGES = st.one_of(st.lists(MESSAGE, min_size=1, max_size=3), HOSTILE)
PROMPT_VALUES = st.one_of(st.sampled_from(PROMPTS), ODD_TEXT, st.lists(st.sampled_from(PROMPTS), max_size=3),
                          st.lists(st.integers(-1, 3), max_size=3), HOSTILE)


def _cheap(body: dict) -> dict:
    """A live body: a valid token count over 4 becomes 4, and chat always bounds its output."""
    for name in ("max_tokens", "max_completion_tokens", "min_tokens"):
        v = body.get(name)
        if isinstance(v, int) and not isinstance(v, bool) and 4 < v < 2**31:
            body[name] = 4
    body.setdefault("max_tokens", 4)
    return body


@st.composite
def openai_bodies(draw, model: str) -> tuple[str, dict]:
    """(path, body) for /v1/chat/completions or /v1/completions, with a few hostile parameters."""
    chat = draw(st.booleans())
    values = CHAT_VALUES if chat else SAMPLING_VALUES
    body: dict = {"model": draw(st.sampled_from([model] * 9 + ["nope"]))}
    body["messages" if chat else "prompt"] = draw(CHAT_MESSAGES if chat else PROMPT_VALUES)
    for name in draw(st.lists(st.sampled_from(sorted(values)), max_size=4, unique=True)):
        body[name] = draw(values[name])
    return ("/v1/chat/completions" if chat else "/v1/completions"), _cheap(body)
