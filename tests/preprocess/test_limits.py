"""preprocess's limits (preprocess/limits.py): each a config.pbtxt parameter with a default, each enforced with an
error naming the input and the setting, each refused when misconfigured (the table: docs/api.md, "Limits")."""
from __future__ import annotations

import json

import pytest

from preprocess.errors import RequestError
from preprocess.limits import RequestLimits
from preprocess.request import RequestParser
from preprocess.serving import PreprocessServing
from preprocess.tokenizer import load_tokenizer
from tests.helpers.checkpoints import DEMO_TARGET
from tests.helpers.triton_fakes import make_pb_utils
from tests.preprocess.test_request import inputs


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(DEMO_TARGET)


def error(parser: RequestParser, **kw) -> str:
    with pytest.raises(RequestError) as e:
        parser.parse(inputs(**kw))
    return str(e.value)


def test_defaults():
    assert RequestLimits() == RequestLimits(max_prompt_bytes=1_000_000, max_model_len=None, max_prompt_tokens=None,
                                            max_stop_words=64, max_stop_word_chars=1_000, max_bad_words=256,
                                            max_logit_bias=1024, max_num_return_sequences=64, max_guide_chars=200_000,
                                            max_guide_depth=64)


@pytest.mark.parametrize("setting, value, request_kw, message", [
    ("max_prompt_bytes", 10, {"text_input": "x" * 11}, "text_input: too large: 11 bytes (limit 10, max_prompt_bytes)"),
    ("max_prompt_tokens", 2, {"text_input": "def add(a, b): return a + b"}, "(max_prompt_tokens)"),
    ("max_stop_words", 2, {"stop_words": ["a", "b", "c"]}, "stop_words: too many: 3 (limit 2, max_stop_words)"),
    ("max_stop_word_chars", 3, {"stop_words": ["abcd"]}, "stop_words: stop string of 4 characters (limit 3, "
                                                         "max_stop_word_chars)"),
    ("max_bad_words", 1, {"bad_words": ["a", "b"]}, "bad_words: too many: 2 (limit 1, max_bad_words)"),
    ("max_logit_bias", 2, {"logit_bias": '{"1": 1, "2": 1, "3": 1}'},
     "logit_bias: too many: 3 tokens (limit 2, max_logit_bias)"),
    ("max_num_return_sequences", 2, {"num_return_sequences": 3}, "num_return_sequences: 3 samples, more than the "
                                                                 "limit of 2 (max_num_return_sequences)"),
    ("max_guide_chars", 10, {"guided_decoding_guide_type": "regex", "guided_decoding_guide": "a" * 11},
     "guided_decoding_guide: 11 characters, more than the limit of 10 (max_guide_chars)"),
    ("max_guide_depth", 3, {"guided_decoding_guide_type": "regex", "guided_decoding_guide": "((((a))))"},
     "guided_decoding_guide: nested 4 levels deep, more than the limit of 3 (max_guide_depth)"),
])
def test_each_limit_is_a_setting_and_its_error_names_it(tok, setting, value, request_kw, message):
    at_default = RequestParser(tok)
    assert at_default.parse(inputs(**request_kw))          # within the default
    limited = RequestParser(tok, RequestLimits.from_parameters({setting: str(value)}))
    assert message in error(limited, **request_kw)


def test_deep_guides_are_refused_by_the_default_depth_not_a_recursion_error(tok):
    parser = RequestParser(tok)
    deep = {"json_schema": '{"type":"array","items":' * 300 + "{}" + "}" * 300,
            "regex": "(" * 2_000 + "a" + ")" * 2_000,
            "ebnf_grammar": "root ::= " + "(" * 2_000 + '"a"' + ")" * 2_000}
    for kind, guide in deep.items():
        msg = error(parser, guided_decoding_guide_type=kind, guided_decoding_guide=guide)
        assert msg.startswith("guided_decoding_guide: nested") and "(max_guide_depth)" in msg, msg
    # at the highest setting allowed, every parser still reads a guide that deep
    at_cap = RequestParser(tok, RequestLimits(max_guide_depth=100))
    for kind, guide in {"json_schema": '{"type":"array","items":' * 99 + '{"type":"null"}' + "}" * 99,
                        "regex": "(" * 100 + "a" + ")" * 100}.items():
        assert at_cap.parse(inputs(guided_decoding_guide_type=kind, guided_decoding_guide=guide))
    # quoted brackets are text, not nesting
    assert parser.parse(inputs(guided_decoding_guide_type="ebnf_grammar",
                               guided_decoding_guide='root ::= "' + "(" * 300 + '"'))


@pytest.mark.parametrize("params, message", [
    ({"max_stop_words": "0"}, "max_stop_words: must be an integer >= 1"),
    ({"max_num_return_sequences": "65"}, "max_num_return_sequences: at most 64"),
    ({"max_guide_depth": "101"}, "max_guide_depth: at most 100"),
    ({"max_prompt_tokens": "0"}, "max_prompt_tokens: must be >= 1"),
    ({"max_guide_chars": "lots"}, "max_guide_chars: expected an integer parameter"),
])
def test_a_bad_setting_is_refused_naming_it(params, message):
    with pytest.raises(ValueError, match=message):
        RequestLimits.from_parameters(params)


def test_the_model_reads_every_limit_from_its_parameters():
    config = {"name": "preprocess", "input": [{"name": "text_input"}],
              "parameters": {"tokenizer_path": {"string_value": str(DEMO_TARGET)},
                             "max_stop_words": {"string_value": "5"}, "max_model_len": {"string_value": ""},
                             "max_guide_depth": {"string_value": "16"}}}
    limits = PreprocessServing.from_model_config(config, make_pb_utils()).parser.limits
    ctx = json.loads((DEMO_TARGET / "config.json").read_text())["max_position_embeddings"]
    assert (limits.max_stop_words, limits.max_guide_depth, limits.max_model_len) == (5, 16, ctx)
