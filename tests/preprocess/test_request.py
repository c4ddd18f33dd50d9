"""preprocess.request: parsing and validating one Triton request (TensorRT-LLM input names)."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from contracts.output_options import OutputOptions
from contracts.sampling_params import SamplingParams
from preprocess.errors import RequestError
from preprocess.request import PreprocessedRequest, RequestLimits, RequestParser, output_options_json
from preprocess.tokenizer import load_tokenizer
from tests.helpers.checkpoints import DEMO_TARGET  # noqa: E402

DEMO = DEMO_TARGET


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(DEMO)


@pytest.fixture(scope="module")
def parser(tok):
    return RequestParser(tok)


def arr(value, batch: bool = True):
    """A Triton-style input array: scalars [1, 1] (or [1]), lists [1, N] (or [N]), BYTES as objects."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, (list, tuple)):
        a = np.array([v.encode() if isinstance(v, str) else v for v in value], dtype=object)
        return a[None, :] if batch else a
    if isinstance(value, bool):
        a = np.array([value], dtype=bool)
    elif isinstance(value, int):
        a = np.array([value], dtype=np.int32)
    elif isinstance(value, float):
        a = np.array([value], dtype=np.float32)
    elif isinstance(value, (str, bytes)):
        a = np.array([value.encode() if isinstance(value, str) else value], dtype=object)
    else:
        raise TypeError(value)
    return a[None, :] if batch else a


def inputs(batch: bool = True, **kw):
    base = {"text_input": "def add(a, b):", "max_tokens": 16}
    base.update(kw)
    return {k: (None if v is None else arr(v, batch)) for k, v in base.items()}


# -- valid requests ---------------------------------------------------------------------------

@pytest.mark.parametrize("batch", [True, False])
def test_minimal_request_defaults(parser, tok, batch):
    r = parser.parse(inputs(batch))
    assert isinstance(r, PreprocessedRequest)
    assert list(r.prompt_token_ids) == tok.encode("def add(a, b):")
    assert r.prompt_token_ids[0] == tok.bos_token_id
    assert r.prompt_text == "def add(a, b):"
    assert r.sampling_params == SamplingParams(max_tokens=16)  # every other default is SamplingParams'
    o = r.options
    assert o == OutputOptions(num_input_tokens=len(r.prompt_token_ids), prompt_token_ids=r.prompt_token_ids)
    assert (o.skip_special_tokens, o.include_stop_str_in_output, o.exclude_input_in_output, o.stream) == (
        True, False, False, False)
    assert r.stop == () and o.n == 1 and o.guide_type is None


def test_scalar_shapes_without_any_dim(parser):
    r = parser.parse({"text_input": np.array(b"x = 1", dtype=object), "max_tokens": np.array(5, dtype=np.int64)})
    assert r.sampling_params.max_tokens == 5


def test_str_elements_and_numpy_bytes_are_accepted(parser):
    r = parser.parse({"text_input": np.array([["x = 1"]], dtype=object),
                      "max_tokens": np.array([[3]], dtype=np.int32),
                      "stop_words": np.array([b"a", b"b"], dtype="S1")})
    assert r.prompt_text == "x = 1" and r.stop == ("a", "b")


def test_all_sampling_inputs_reach_sampling_params(parser):
    r = parser.parse(inputs(temperature=0.5, top_p=0.9, top_k=40, min_p=0.05, repetition_penalty=1.1,
                            presence_penalty=0.5, frequency_penalty=-0.5,
                            seed=np.array([[2**64 - 1]], dtype=np.uint64), end_id=6, min_tokens=2,
                            num_return_sequences=3, return_log_probs=True))
    p = r.sampling_params
    assert (p.temperature, p.top_k, p.seed, p.stop_token_ids, p.min_tokens, p.n, p.logprobs) == (
        0.5, 40, 2**64 - 1, (6,), 2, 3, 0)
    assert p.top_p == pytest.approx(0.9) and p.min_p == pytest.approx(0.05)
    assert p.repetition_penalty == pytest.approx(1.1)
    assert (p.presence_penalty, p.frequency_penalty) == (0.5, -0.5)
    assert r.options.n == 3 and r.options.return_log_probs


def test_ignore_eos_and_logit_bias_reach_sampling_params(parser):
    p = parser.parse(inputs(ignore_eos=True, logit_bias='{"17": 2.5, "5": -100, "4095": 100}')).sampling_params
    assert p.ignore_eos and p.logit_bias == ((5, -100.0), (17, 2.5), (4095, 100.0))
    p = parser.parse(inputs(ignore_eos=False, logit_bias="{}")).sampling_params
    assert not p.ignore_eos and p.logit_bias == ()


@pytest.mark.parametrize("text, message", [
    ('{"4096": 1}', "logit_bias: token id 4096 is outside the vocabulary [0, 4096)"),
    ('{"7": 150}', "logit_bias: the bias of token 7 must be a number in [-100, 100], got 150"),
    ('{"x7": 1}', "logit_bias: key 'x7' is not a token id (a decimal integer)"),
])
def test_logit_bias_errors_name_the_token(parser, text, message):
    with pytest.raises(RequestError) as e:
        parser.parse(inputs(logit_bias=text))
    assert str(e.value) == message


def test_top_logprobs_asks_the_engine_for_alternatives(parser):
    assert parser.parse(inputs(return_log_probs=True, top_logprobs=3)).sampling_params.logprobs == 3
    assert parser.parse(inputs(return_log_probs=True)).sampling_params.logprobs == 0
    for bad, why in ((dict(top_logprobs=2), "needs return_log_probs"),
                     (dict(return_log_probs=True, top_logprobs=21), r"\[0, 20\]")):
        with pytest.raises(RequestError, match=why) as e:
            parser.parse(inputs(**bad))
        assert e.value.field == "top_logprobs"


def test_min_length_is_an_alias_of_min_tokens(parser):
    assert parser.parse(inputs(min_length=4)).sampling_params.min_tokens == 4
    assert parser.parse(inputs(min_length=4, min_tokens=4)).sampling_params.min_tokens == 4


@pytest.mark.parametrize("batch", [True, False])
def test_stop_words_stay_text(parser, batch):
    r = parser.parse(inputs(batch, stop_words=["\n\n", "return", " return", "\n\n"]))
    assert r.stop == ("\n\n", "return", " return")  # deduplicated, order kept, not tokenized
    assert r.sampling_params.stop_token_ids == ()


def test_bad_words_include_space_prefixed_variant(parser, tok):
    r = parser.parse(inputs(bad_words=["import", " def"]))
    seqs = r.sampling_params.bad_words_ids
    assert tuple(tok.encode("import", add_special_tokens=False)) in seqs
    assert tuple(tok.encode(" import", add_special_tokens=False)) in seqs
    assert tuple(tok.encode(" def", add_special_tokens=False)) in seqs
    assert tuple(tok.encode("  def", add_special_tokens=False)) not in seqs  # already space-prefixed
    assert len(seqs) == 3


def test_output_options(parser):
    r = parser.parse(inputs(skip_special_tokens=False, include_stop_str_in_output=True, stream=True,
                            return_num_input_tokens=True, return_num_output_tokens=True,
                            exclude_input_in_output=True, stop_words=["}"]))
    o = r.options
    assert (o.skip_special_tokens, o.include_stop_str_in_output, o.stream, o.exclude_input_in_output) == (
        False, True, True, True)
    assert o.return_num_input_tokens and o.return_num_output_tokens and not o.return_log_probs
    assert o.stop == ("}",)


def test_options_json_round_trip_and_prompt_ids(parser):
    long_prompt = "x = 1\n" * 40
    full = parser.parse(inputs(text_input=long_prompt))
    assert full.options.prompt_token_ids == full.prompt_token_ids  # text_output starts with the prompt
    tail = parser.parse(inputs(text_input=long_prompt, exclude_input_in_output=True, stop_words=["é", '"']))
    assert tail.options.prompt_token_ids == tail.prompt_token_ids[-8:]  # only context for the detokenizer
    assert tail.options.num_input_tokens == len(tail.prompt_token_ids)
    text = output_options_json(tail)
    assert text == tail.options_json()
    assert json.loads(text)["v"] == 1 and json.loads(text)["stop"] == ["é", '"']
    assert OutputOptions.from_json(text) == tail.options
    assert OutputOptions.from_json(text.encode()) == tail.options


def test_guided_decoding(parser):
    r = parser.parse(inputs(guided_decoding_guide_type="json"))
    assert r.sampling_params.guide.kind == "json" and r.options.guide_type == "json"
    r = parser.parse(inputs(guided_decoding_guide_type="regex", guided_decoding_guide="[a-z]+"))
    assert r.options.guide == "[a-z]+"                  # postprocess checks the finished output against it
    assert OutputOptions.from_json(r.options_json()).guide == "[a-z]+"
    schema = json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}})
    r = parser.parse(inputs(guided_decoding_guide_type="json_schema", guided_decoding_guide=schema))
    assert r.sampling_params.guide.guide == schema
    r = parser.parse(inputs(guided_decoding_guide_type="regex", guided_decoding_guide="[0-9]+"))
    assert r.sampling_params.guide.kind == "regex"


def test_messages_render_with_chat_template(parser, tok):
    from transformers import PreTrainedTokenizerFast

    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Sum 2+2"}]
    r = parser.parse(inputs(text_input=None, messages=json.dumps(msgs)))
    hf = PreTrainedTokenizerFast.from_pretrained(str(DEMO))
    assert r.prompt_text == hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert list(r.prompt_token_ids) == hf(r.prompt_text, add_special_tokens=False)["input_ids"]
    assert r.prompt_token_ids.count(tok.bos_token_id) == 1  # BOS from the template only


def test_prompt_token_limit_boundary(tok):
    text = "a b c d e f g h"
    n = len(tok.encode(text))
    assert RequestParser(tok, RequestLimits(max_model_len=n + 1)).parse(inputs(text_input=text))
    with pytest.raises(RequestError) as e:
        RequestParser(tok, RequestLimits(max_model_len=n)).parse(inputs(text_input=text))
    assert e.value.field == "text_input"
    assert f"{n} tokens" in str(e.value) and f"context is {n} tokens" in str(e.value)


def test_preprocessed_request_is_frozen(parser):
    r = parser.parse(inputs())
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.prompt_text = "x"


def test_no_chat_template_rejects_messages(tmp_path):
    import shutil
    for f in ("tokenizer.json", "special_tokens_map.json"):
        shutil.copy(DEMO / f, tmp_path / f)
    cfg = json.loads((DEMO / "tokenizer_config.json").read_text())
    del cfg["chat_template"]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    p = RequestParser(load_tokenizer(tmp_path))
    with pytest.raises(RequestError) as e:
        p.parse(inputs(text_input=None, messages='[{"role": "user", "content": "x"}]'))
    assert e.value.field == "messages" and "chat_template" in str(e.value)


# -- invalid requests: every error names the input at fault -----------------------------------

MSG = '[{"role": "user", "content": "hi"}]'
BAD = [
    ("max_tokens missing", dict(max_tokens=None), "max_tokens"),
    ("max_tokens zero", dict(max_tokens=0), "max_tokens"),
    ("max_tokens negative", dict(max_tokens=-3), "max_tokens"),
    ("max_tokens float dtype", dict(max_tokens=16.0), "max_tokens"),
    ("max_tokens two values", dict(max_tokens=np.array([[1, 2]], dtype=np.int32)), "max_tokens"),
    ("max_tokens not an array", dict(max_tokens=None, _raw_max_tokens=16), "max_tokens"),
    ("no prompt", dict(text_input=None), "text_input"),
    ("empty prompt", dict(text_input=""), "text_input"),
    ("prompt not utf-8", dict(text_input=b"\xff\xfeabc"), "text_input"),
    ("prompt int dtype", dict(text_input=np.array([[1]], dtype=np.int32)), "text_input"),
    ("prompt batch of two", dict(text_input=np.array([[b"a"], [b"b"]], dtype=object)), "text_input"),
    ("prompt over 1 MB", dict(text_input="x" * 1_000_001), "text_input"),
    ("prompt over context", dict(text_input="a " * 1100), "text_input"),
    ("temperature NaN", dict(temperature=float("nan")), "temperature"),
    ("temperature inf", dict(temperature=float("inf")), "temperature"),
    ("temperature negative", dict(temperature=-0.5), "temperature"),
    ("temperature string", dict(temperature="hot"), "temperature"),
    ("top_p zero", dict(top_p=0.0), "top_p"),
    ("top_p above one", dict(top_p=1.5), "top_p"),
    ("top_k negative", dict(top_k=-1), "top_k"),
    ("top_k beyond int32", dict(top_k=np.array([[2**40]], dtype=np.int64)), "top_k"),
    ("min_p above one", dict(min_p=2.0), "min_p"),
    ("repetition_penalty zero", dict(repetition_penalty=0.0), "repetition_penalty"),
    ("presence_penalty above 2", dict(presence_penalty=3.0), "presence_penalty"),
    ("frequency_penalty below -2", dict(frequency_penalty=-2.5), "frequency_penalty"),
    ("frequency_penalty -inf", dict(frequency_penalty=float("-inf")), "frequency_penalty"),
    ("seed negative", dict(seed=np.array([[-1]], dtype=np.int64)), "seed"),
    ("seed float", dict(seed=1.0), "seed"),
    ("stream int dtype", dict(stream=1), "stream"),
    ("exclude_input float", dict(exclude_input_in_output=1.0), "exclude_input_in_output"),
    ("skip_special_tokens bytes", dict(skip_special_tokens="yes"), "skip_special_tokens"),
    ("empty stop word", dict(stop_words=["ok", ""]), "stop_words"),
    ("stop word not utf-8", dict(stop_words=np.array([[b"\xc3"]], dtype=object)), "stop_words"),
    ("stop words batch of two", dict(stop_words=np.array([[b"a"], [b"b"]], dtype=object)), "stop_words"),
    ("too many stop words", dict(stop_words=[f"s{i}" for i in range(65)]), "stop_words"),
    ("empty bad word", dict(bad_words=[""]), "bad_words"),
    ("end_id out of vocab", dict(end_id=4096), "end_id"),
    ("end_id negative", dict(end_id=-1), "end_id"),
    ("min_tokens above max_tokens", dict(min_tokens=20), "min_tokens"),
    ("min_length above max_tokens", dict(min_length=20), "min_length"),
    ("min_tokens and min_length differ", dict(min_tokens=1, min_length=2), "min_tokens"),
    ("num_return_sequences zero", dict(num_return_sequences=0), "num_return_sequences"),
    ("num_return_sequences 65", dict(num_return_sequences=65), "num_return_sequences"),
    ("beam search", dict(beam_width=4), "beam_width"),
    ("unknown guide type", dict(guided_decoding_guide_type="xml"), "guided_decoding_guide_type"),
    ("guide without type", dict(guided_decoding_guide="[0-9]+"), "guided_decoding_guide_type"),
    ("regex without guide", dict(guided_decoding_guide_type="regex"), "guided_decoding_guide"),
    ("json_schema not JSON", dict(guided_decoding_guide_type="json_schema", guided_decoding_guide="{a"),
     "guided_decoding_guide"),
    ("json_schema not object", dict(guided_decoding_guide_type="json_schema", guided_decoding_guide="[1]"),
     "guided_decoding_guide"),
    ("json_schema keyword xgrammar ignores", dict(guided_decoding_guide_type="json_schema",
                                                  guided_decoding_guide='{"type": "array", "uniqueItems": true}'),
     "guided_decoding_guide"),
    ("json_schema pattern beside maxLength", dict(guided_decoding_guide_type="json_schema", guided_decoding_guide=(
        '{"type": "string", "pattern": "^a+$", "maxLength": 3}')), "guided_decoding_guide"),
    ("invalid regex", dict(guided_decoding_guide_type="regex", guided_decoding_guide="(ab"), "guided_decoding_guide"),
    ("regex xgrammar cannot compile", dict(guided_decoding_guide_type="regex", guided_decoding_guide="(?=a)b"),
     "guided_decoding_guide"),
    ("EBNF syntax error", dict(guided_decoding_guide_type="ebnf_grammar", guided_decoding_guide='root ::= "a" |'),
     "guided_decoding_guide"),
    ("EBNF without root", dict(guided_decoding_guide_type="ebnf_grammar", guided_decoding_guide='expr ::= "a"'),
     "guided_decoding_guide"),
    ("guided with stop_words", dict(guided_decoding_guide_type="json", stop_words=["}"]), "stop_words"),
    ("guided with end_id", dict(guided_decoding_guide_type="json", end_id=5), "end_id"),
    ("guided with min_tokens", dict(guided_decoding_guide_type="json", min_tokens=2), "min_tokens"),
    ("guided with min_length", dict(guided_decoding_guide_type="json", min_length=2), "min_length"),
    ("messages not JSON", dict(text_input=None, messages="[{"), "messages"),
    ("messages not a list", dict(text_input=None, messages='{"role": "user"}'), "messages"),
    ("messages empty list", dict(text_input=None, messages="[]"), "messages"),
    ("message without role", dict(text_input=None, messages='[{"content": "x"}]'), "messages"),
    ("message content number", dict(text_input=None, messages='[{"role": "user", "content": 3}]'), "messages"),
    ("messages and text_input", dict(messages=MSG), "messages"),
    ("unknown input", dict(temprature=0.5), "temprature"),
    ("guided with ignore_eos", dict(guided_decoding_guide_type="json", ignore_eos=True), "ignore_eos"),
    ("ignore_eos not BOOL", dict(ignore_eos=1), "ignore_eos"),
    ("logit_bias not JSON", dict(logit_bias="{5: 1}"), "logit_bias"),
    ("logit_bias a list", dict(logit_bias="[[5, 1]]"), "logit_bias"),
    ("logit_bias key not an id", dict(logit_bias='{"a": 1}'), "logit_bias"),
    ("logit_bias negative id", dict(logit_bias='{"-1": 1}'), "logit_bias"),
    ("logit_bias id past the vocabulary", dict(logit_bias='{"4096": 1}'), "logit_bias"),
    ("logit_bias above 100", dict(logit_bias='{"5": 100.5}'), "logit_bias"),
    ("logit_bias below -100", dict(logit_bias='{"5": -101}'), "logit_bias"),
    ("logit_bias not a number", dict(logit_bias='{"5": "1"}'), "logit_bias"),
    ("logit_bias NaN", dict(logit_bias='{"5": NaN}'), "logit_bias"),
    ("logit_bias a token twice", dict(logit_bias='{"5": 1, "05": 2}'), "logit_bias"),
]


@pytest.mark.parametrize("overrides, field", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input_names_the_field(parser, overrides, field):
    overrides = dict(overrides)
    raw = {k[len("_raw_"):]: overrides.pop(k) for k in list(overrides) if k.startswith("_raw_")}
    req = inputs(**overrides)
    req.update(raw)
    with pytest.raises(RequestError) as e:
        parser.parse(req)
    assert e.value.field == field, str(e.value)
    assert str(e.value).startswith(field + ":")
    assert isinstance(e.value, ValueError)


def test_many_distinct_bad_cases():
    assert len(BAD) >= 20
    assert len({b[2] for b in BAD}) >= 20  # at least 20 different fields covered
