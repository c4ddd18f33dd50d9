"""The check of finished outputs, each guide type both ways."""
from __future__ import annotations

import json

import pytest

from grammar import check_output
from grammar.regex import python_pattern

SCHEMA = json.dumps({"type": "object", "properties": {
    "n": {"type": "integer", "minimum": 0}, "s": {"type": "string", "pattern": "^\\d+$"},
    "id": {"type": "string", "format": "uuid"}}, "required": ["n"], "additionalProperties": False})


@pytest.mark.parametrize("kind, guide, text, ok", [
    ("json", "", '{"a": [1, 2]}', True),
    ("json", "", "3", True),
    ("json", "", '{"a": 1', False),
    ("json", "", '"a\x05"', False),                                 # raw control character
    ("json_schema", SCHEMA, '{"n": 3}', True),
    ("json_schema", SCHEMA, '{"n": -1}', False),
    ("json_schema", SCHEMA, '{"n": 1, "x": 2}', False),
    ("json_schema", SCHEMA, '{"n": 1, "s": "12"}', True),
    ("json_schema", SCHEMA, '{"n": 1, "s": "\u0663"}', False),     # Arabic-Indic 3: not an ECMAScript \d
    ("json_schema", SCHEMA, '{"n": 1, "id": "not-a-uuid"}', False),
    ("regex", r"\d{2}-[a-z]+", "12-ab", True),
    ("regex", r"\d{2}-[a-z]+", "12-ab!", False),                   # in full
    ("regex", r"\d+\s?kg", "5\ufeffkg", True),                     # ECMAScript \s has U+FEFF
    ("ebnf_grammar", 'root ::= "(" root ")" | "x"', "((x))", True),
    ("ebnf_grammar", 'root ::= "(" root ")" | "x"', "((x)", False),
])
def test_check_output(kind, guide, text, ok):
    assert (check_output(kind, guide, text) is None) == ok


def test_failures_say_where():
    assert "/n" in check_output("json_schema", SCHEMA, '{"n": -1}')


@pytest.mark.parametrize("pattern, expected", [
    (r"\d", "[0-9]"), (r"[\d_]", "[0-9_]"), (r"\\d", r"\\d"), (r"[\D]", r"[\D]"), (r"[]\d]", "[]0-9]"),
    (r"[^\w]", "[^A-Za-z0-9_]"), (r"a\.b", r"a\.b"),
])
def test_python_pattern(pattern, expected):
    assert python_pattern(pattern) == expected
