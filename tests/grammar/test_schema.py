"""The schema allow-list: every keyword xgrammar 0.2.9 would not enforce is rejected, naming it.

The ``EVIDENCE`` cases keep the measurement behind each rejection: xgrammar compiles the schema and
accepts an instance that violates it. If a newer xgrammar starts enforcing one, its evidence test
fails, which is the cue to move the keyword onto the allow-list."""
from __future__ import annotations

import json
import warnings

import pytest
import xgrammar as xgr

from grammar import GuideError, check_guide
from grammar.schema import check_schema


def xgr_accepts(backend, schema, instance: str) -> bool:
    """Whether xgrammar (compiled as it would be without our checks) admits ``instance`` in full."""
    compiler = xgr.GrammarCompiler(backend.tokenizer_info, cache_enabled=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        g = compiler.compile_json_schema(json.dumps(schema), any_whitespace=False)
    m = xgr.GrammarMatcher(g)
    return m.accept_string(instance) and m.is_completed()


# (keyword named in the error, schema, an instance that violates the schema but xgrammar admits)
EVIDENCE = [
    ("uniqueItems", {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "[1, 1]"),
    ("not", {"not": {"type": "integer"}}, "1"),
    ("dependentRequired", {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                           "dependentRequired": {"a": ["b"]}}, '{"a": 1}'),
    ("dependentSchemas", {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                          "dependentSchemas": {"a": {"required": ["b"]}}}, '{"a": 1}'),
    ("contains", {"type": "array", "items": {"type": "integer"}, "contains": {"const": 5}}, "[1]"),
    ("if", {"if": {"type": "integer"}, "then": {"minimum": 3}}, "2"),
    ("oneOf", {"oneOf": [{"type": "integer"}, {"type": "number"}]}, "1"),
    ("allOf", {"allOf": [{"type": "integer"}, {"minimum": 3}]}, "2"),
    ("contentEncoding", {"type": "string", "contentEncoding": "base64"}, '"!!"'),
    ("minLength", {"type": "string", "pattern": "^[a-z]+$", "maxLength": 2}, '"abc"'),
    ("minLength", {"type": "string", "format": "email", "maxLength": 3}, '"a@b.cd"'),
    ("multipleOf", {"type": "number", "multipleOf": 0.5}, "0.3"),
    ("multipleOf", {"type": "integer", "multipleOf": 1.5}, "1"),
    ("type", {"minimum": 3}, "2"),
    ("type", {"maxLength": 1}, '"abc"'),
    ("type", {"maxItems": 1}, "[1, 2]"),
    ("sibling", {"enum": ["a", "bb"], "type": "string", "maxLength": 1}, '"bb"'),
    ("sibling", {"anyOf": [{"type": "integer"}], "minimum": 3}, "2"),
    ("sibling", {"$defs": {"x": {"type": "integer"}}, "$ref": "#/$defs/x", "minimum": 3}, "2"),
    ("required", {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a", "b"],
                  "additionalProperties": {"type": "integer"}}, '{"a": 1}'),
    ("local references", {"$ref": "http://example.com/s.json"}, "1"),
    ("format 'date'", {"type": "string", "format": "date"}, '"2024-02-30"'),
    ("format 'ipv4'", {"type": "string", "format": "ipv4"}, '"01.2.3.4"'),
]


@pytest.mark.parametrize("keyword, schema, violating", EVIDENCE, ids=[f"{k}-{i}" for i, (k, *_) in enumerate(EVIDENCE)])
def test_unenforced_keywords_are_rejected_and_xgrammar_really_ignores_them(xgr_backend, keyword, schema, violating):
    with pytest.raises(GuideError) as err:
        check_guide("json_schema", json.dumps(schema))
    assert err.value.field == "guided_decoding_guide"
    msg = str(err.value)
    expected = {"sibling": "sibling keywords", "type": "single \"type\"", "minLength": "xgrammar drops the lengths"}
    assert expected.get(keyword, keyword) in msg, msg
    assert xgr_accepts(xgr_backend, schema, violating), "xgrammar now enforces this: widen the allow-list"


def test_the_length_bounded_string_class_of_xgrammar_admits_control_characters(xgr_backend):
    """The evidence for the repair in guides.schema_grammar (the raw class admits \\x05)."""
    assert xgr_accepts(xgr_backend, {"type": "string", "maxLength": 3}, '"a\x05"')


@pytest.mark.parametrize("schema", [
    True, {}, {"type": "integer", "minimum": 0, "maximum": 9, "title": "digit", "description": "d"},
    {"type": ["string", "null"]}, {"enum": [1, "a", None]}, {"type": "string", "const": "x"},
    {"type": "string", "format": "uuid"}, {"type": "string", "pattern": "^\\d+$"},
    {"type": "object", "propertyNames": {"pattern": "^[a-z]+$"}, "additionalProperties": {"type": "integer"}},
    {"$defs": {"n": {"type": "integer"}}, "type": "array", "prefixItems": [{"$ref": "#/$defs/n"}], "items": False},
    {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
     "properties": {"a": {"anyOf": [{"type": "integer"}, {"type": "null"}]}}, "required": ["a"]},
])
def test_allowed_schemas_pass(schema):
    check_guide("json_schema", json.dumps(schema))


@pytest.mark.parametrize("schema, words", [
    (False, "admits no value"),
    ([1], "must be an object"),
    ({"type": "strnig"}, "type must be one of"),
    ({"type": "object", "properties": {"a": {"type": "integer", "uniqueItems": True}}}, "/properties/a"),
    ({"type": "array", "items": [{"type": "integer"}]}, "prefixItems"),
    ({"type": "integer", "minimum": 1.5}, "whole number"),
    ({"type": "integer", "maximum": 2**64}, "64-bit"),
    ({"type": "string", "minLength": 3, "maxLength": 1}, "exceeds maxLength"),
    ({"type": "string", "pattern": "a(b"}, "not a valid regular expression"),
    ({"type": "integer", "exclusiveMinimum": True}, "finite number"),
    ({"$ref": "#/$defs/missing"}, "cannot compile"),
    ({"type": "string", "minLength": "3"}, "non-negative integer"),
    ({"type": "integer", "minimum": 3, "maximum": 1}, "cannot compile"),
])
def test_bad_schemas_name_the_problem(schema, words):
    with pytest.raises(GuideError) as err:
        check_guide("json_schema", json.dumps(schema))
    assert words in str(err.value) and str(err.value).startswith("guided_decoding_guide: ")


def test_check_schema_walks_definitions():
    with pytest.raises(GuideError, match=r"/\$defs/x.*uniqueItems"):
        check_schema({"$defs": {"x": {"type": "array", "uniqueItems": True}}, "$ref": "#/$defs/x"})
