"""Hypothesis strategies for hostile ensemble requests: every input of config.pbtxt with the right or a wrong
dtype, odd shapes, NaN/inf floats, extreme integers, huge and empty strings, invalid UTF-8, UTF-16 surrogates,
thousands of stop words, deeply nested or huge guides and messages. Shared by the in-process fuzz
(tests/preprocess/test_fuzz_preprocess.py) and the live one (tests/e2e/test_fuzz_live.py).

``live=True`` keeps what passes validation cheap to serve (a valid ``max_tokens`` or ``min_tokens`` is at most 4,
``num_return_sequences`` at most 2) and every array at least one-dimensional (tritonclient sends shapes as lists).
"""
from __future__ import annotations

import json
import math

import numpy as np
from hypothesis import strategies as st

from cli.client import INPUT_TYPES, LIST_INPUTS

NUMPY_OF = {"BYTES": np.object_, "INT32": np.int32, "UINT64": np.uint64, "FP32": np.float32, "FP16": np.float16, "BOOL": np.bool_}
WRONG_DTYPES = (np.bool_, np.int8, np.int32, np.int64, np.uint8, np.uint64, np.float16, np.float32, np.float64,
                np.object_)
SPECIAL_FLOATS = (math.nan, math.inf, -math.inf, 0.0, -0.0, 1e38, -1e38, 5e-324, 2.0, -1.0, 1.0)
SPECIAL_INTS = (0, -1, 1, 2, 2**31 - 1, -(2**31), 2**32, 2**63 - 1, -(2**63), 2**64 - 1, 100_000)


def _deep(open_: str, middle: str, close: str, depth: int) -> str:
    return open_ * depth + middle + close * depth


HUGE = b"x" * 1_000_001                         # one byte over preprocess's max_prompt_bytes
NASTY_BYTES = (b"", b" ", b"\xff\xfe", b"\xc0\x80", b"\xed\xa0\x80", b"\x00", b"\xf4\x90\x80\x80", b"\x80" * 3,
               "\u202e\ufeff\U0010ffff".encode(), "a\ud800b".encode("utf-8", "surrogatepass"), HUGE)
SCHEMA = '{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]}'
NASTY_GUIDES = (
    "", " ", "{}", "[]", "null", "true", "false", SCHEMA, "[a-z]+", "a{2,3}", "(a|b)*c", 'root ::= "a" | "b"',
    '{"type": "string", "maxLength": 100000000}', '{"$ref": "#"}', '{"type": "array", "items": {"$ref": "#"}}',
    '{"anyOf": []}', '{"enum": []}', "(", ")", "[", "\\", "(?<x>a)", "a**", "root ::=", "root ::= root",
    _deep('{"type":"array","items":', '{"type":"null"}', "}", 20),
    _deep('{"type":"array","items":', '{"type":"null"}', "}", 5_000),
    _deep("[", "", "]", 100_000), _deep("(", "a", ")", 5_000), _deep("(", "a", ")", 100),
    "root ::= " + _deep("(", '"a"', ")", 5_000), "x" * 250_000, "(a|" * 2_000 + "b" + ")" * 2_000,
)
GUIDE_TYPE_VALUES = ("json", "json_schema", "regex", "ebnf_grammar", "", "JSON", "xml", "grammar", "\x00")
MESSAGES = (
    json.dumps([{"role": "user", "content": "hi"}]), "[]", "{}", "null", "[1]", "not json", '[{"role": ""}]',
    json.dumps([{"role": "user", "content": [{"type": "text", "text": "x"}]}]), _deep("[", "", "]", 100_000),
    json.dumps([{"role": "user", "content": "x" * 2_000}] * 50), '[{"role": "user", "content": 5}]',
)
PROMPTS = ("def f(x):", "import os", " ", "\n", "a", "class A:\n    pass")


def _text_bytes() -> st.SearchStrategy[bytes]:
    return st.one_of(
        st.sampled_from(PROMPTS).map(str.encode),
        st.binary(max_size=48),
        st.text(max_size=48).map(lambda s: s.encode("utf-8", "surrogatepass")),
        st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=8)
        .map(lambda s: s.encode("utf-8", "surrogatepass")),
        st.sampled_from(NASTY_BYTES),
    )


def _bytes_for(name: str) -> st.SearchStrategy[bytes]:
    if name == "guided_decoding_guide":
        return st.one_of(st.sampled_from(NASTY_GUIDES).map(str.encode), _text_bytes())
    if name == "guided_decoding_guide_type":
        return st.one_of(st.sampled_from(GUIDE_TYPE_VALUES).map(str.encode), _text_bytes())
    if name == "messages":
        return st.one_of(st.sampled_from(MESSAGES).map(str.encode), _text_bytes())
    return _text_bytes()


def _ints(name: str, live: bool) -> st.SearchStrategy[int]:
    if live and name in ("max_tokens", "min_tokens", "min_length"):
        return st.one_of(st.integers(1, 4), st.sampled_from((0, -1, 2**31 - 1, 100_000)))
    if live and name == "num_return_sequences":
        return st.one_of(st.integers(1, 2), st.sampled_from((0, -1, 65, 2**31 - 1)))
    return st.one_of(st.integers(-4, 64), st.sampled_from(SPECIAL_INTS), st.integers(-(2**63), 2**64 - 1))


def _fill(dtype, name: str, live: bool, size: int) -> st.SearchStrategy[list]:
    if dtype is np.object_:
        return st.lists(_bytes_for(name), min_size=size, max_size=size)
    if dtype is np.bool_:
        return st.lists(st.booleans(), min_size=size, max_size=size)
    if np.issubdtype(dtype, np.floating):
        floats = st.one_of(st.sampled_from(SPECIAL_FLOATS), st.floats(width=32, allow_nan=True, allow_infinity=True))
        return st.lists(floats, min_size=size, max_size=size)
    info = np.iinfo(dtype)
    ints = _ints(name, live).map(lambda v: int(min(max(v, info.min), info.max)))
    return st.lists(ints, min_size=size, max_size=size)


@st.composite
def input_array(draw, name: str, live: bool = False) -> np.ndarray:
    """One input's array: mostly its own dtype and a ``[1, 1]`` / ``[1, N]`` shape, else anything."""
    right = NUMPY_OF[INPUT_TYPES[name]] if name in INPUT_TYPES else np.object_
    dtype = draw(st.sampled_from((right,) * 6 + WRONG_DTYPES))
    if name in LIST_INPUTS and dtype is np.object_ and draw(st.integers(0, 9)) == 0:   # thousands of words
        n = draw(st.sampled_from((65, 1_000, 5_000)))
        return np.asarray([[b"w%d" % i for i in range(n)]], dtype=np.object_)
    if name in LIST_INPUTS:
        shapes = [(1, 1), (1, 2), (1, 5), (1, 0), (3,), (2, 2), (1, 1, 2)]
    else:
        shapes = [(1, 1)] * 6 + [(1,), (1, 2), (2, 1), (1, 0), (1, 1, 1)]
    if not live:
        shapes.append(())
    shape = draw(st.sampled_from(shapes))
    size = int(np.prod(shape)) if shape else 1
    values = draw(_fill(dtype, name, live, size))
    if dtype is np.object_:
        arr = np.empty(size, dtype=np.object_)
        arr[:] = values
        return arr.reshape(shape)
    with np.errstate(all="ignore"):
        return np.asarray(values, dtype=np.float64 if np.issubdtype(dtype, np.floating) else None).astype(
            dtype).reshape(shape)


FUZZED_NAMES = sorted(set(INPUT_TYPES) - {"stop"})   # a stop request carries no prompt: it skips validation


@st.composite
def request_inputs(draw, live: bool = False) -> dict[str, np.ndarray]:
    """One request: usually a sound prompt and ``max_tokens``, then a few fuzzed inputs (now and then an
    unknown one)."""
    inputs: dict[str, np.ndarray] = {}
    if draw(st.integers(0, 4)):
        inputs["text_input"] = np.asarray([[draw(st.sampled_from(PROMPTS)).encode()]], dtype=np.object_)
    if draw(st.integers(0, 4)):
        inputs["max_tokens"] = np.asarray([[draw(st.integers(1, 4))]], dtype=np.int32)
    names = draw(st.lists(st.sampled_from(FUZZED_NAMES), min_size=1, max_size=5, unique=True))
    if draw(st.integers(0, 19)) == 0:
        names.append(draw(st.sampled_from(["max_new_tokens", "TEXT_INPUT", "temperature ", "x" * 300])))
    for name in names:
        inputs[name] = draw(input_array(name, live))
    return inputs
