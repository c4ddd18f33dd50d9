"""Guides of every kind (JSON schemas, regexes, EBNF grammars, structural tags): the set that
``bench_guided`` compiles, and that the grammar, engine and end-to-end tests run."""
from __future__ import annotations

import json

SCHEMAS: dict[str, dict] = {
    "nested_object": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "address": {"type": "object", "properties": {
                "city": {"type": "string", "minLength": 1, "maxLength": 10},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                "required": ["city", "zip"], "additionalProperties": False},
        },
        "required": ["name", "address"], "additionalProperties": False,
    },
    "array_min_max_items": {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": {"type": "string", "maxLength": 6},
                                "minItems": 1, "maxItems": 3}},
        "required": ["tags"], "additionalProperties": False,
    },
    "enums": {
        "type": "object",
        "properties": {"color": {"enum": ["red", "green", "blue"]},
                       "size": {"type": "string", "enum": ["S", "M", "L"]},
                       "flag": {"const": True}},
        "required": ["color", "size", "flag"], "additionalProperties": False,
    },
    "integer_bounds": {
        "type": "object",
        "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 120},
                       "delta": {"type": "integer", "exclusiveMinimum": -10, "exclusiveMaximum": 10},
                       "even": {"type": "integer", "multipleOf": 2, "minimum": 0, "maximum": 100}},
        "required": ["age", "delta", "even"], "additionalProperties": False,
    },
    "number_bounds": {
        "type": "object",
        "properties": {"ratio": {"type": "number", "minimum": 0, "maximum": 1},
                       "temp": {"type": "number", "exclusiveMinimum": -40.5, "exclusiveMaximum": 60.25}},
        "required": ["ratio", "temp"], "additionalProperties": False,
    },
    "string_patterns": {
        "type": "object",
        "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"},
                       "word": {"type": "string", "pattern": "^[a-z]{1,8}$"}},
        "required": ["code", "word"], "additionalProperties": False,
    },
    "string_lengths": {
        "type": "object",
        "properties": {"short": {"type": "string", "maxLength": 3},
                       "exact": {"type": "string", "minLength": 4, "maxLength": 4},
                       "longish": {"type": "string", "minLength": 2, "maxLength": 20}},
        "required": ["short", "exact", "longish"], "additionalProperties": False,
    },
    "required_and_optional": {
        "type": "object",
        "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 9999},
                       "note": {"type": "string", "maxLength": 8},
                       "done": {"type": "boolean"},
                       "parent": {"type": ["integer", "null"]}},
        "required": ["id"], "additionalProperties": False,
    },
    "list_of_records": {
        "type": "array", "minItems": 1, "maxItems": 2,
        "items": {"type": "object", "properties": {"k": {"type": "string", "maxLength": 4},
                                                   "v": {"type": "integer", "minimum": -5, "maximum": 5}},
                  "required": ["k", "v"], "additionalProperties": False},
    },
    "refs_and_any_of": {
        "$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9},
                                                             "y": {"type": "integer", "minimum": 0, "maximum": 9}},
                            "required": ["x", "y"], "additionalProperties": False}},
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/point"},
                       "b": {"anyOf": [{"$ref": "#/$defs/point"}, {"type": "null"}]}},
        "required": ["a", "b"], "additionalProperties": False,
    },
}

REGEXES: dict[str, str] = {
    "date": r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])",
    "email": r"[a-z][a-z0-9._]{0,15}@[a-z]{2,10}\.(com|org|net)",
    "identifier": r"[A-Za-z_][A-Za-z0-9_]{0,15}",
    "number_with_unit": r"-?\d{1,4}(\.\d{1,2})? ?(kg|g|m|cm|s|ms)",
}

GRAMMARS: dict[str, str] = {
    "arithmetic": r'''
root ::= expr
expr ::= term (("+" | "-") term)*
term ::= factor (("*" | "/") factor)*
factor ::= number | "(" expr ")"
number ::= [1-9] [0-9]{0,3} | "0"
''',
    "key_value_config": r'''
root ::= line{1,4}
line ::= key " = " value "\n"
key ::= [a-z] [a-z_]{0,10}
value ::= number | boolean | string
number ::= "-"? [0-9]{1,5}
boolean ::= "true" | "false"
string ::= "\"" [a-zA-Z0-9 ]{0,12} "\""
''',
}


# structural tags: free text, with each tagged region's JSON under its schema
STRUCTURAL_TAGS = {
    # code writes "(" often: every one opens an integer and its ")"
    "paren_int": {"structures": [{"begin": "(", "schema": {"type": "integer", "minimum": 0}, "end": ")"}],
                  "triggers": ["("]},
    # the OpenAI API's tool_choice "auto" (gateway/openai/guides.py): a Hermes-style call of one of two tools
    "tool_call": {"structures": [{"begin": "<tool_call>", "end": "</tool_call>", "schema": {"anyOf": [
        {"type": "object", "properties": {"name": {"const": "weather"}, "arguments": {
            "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"],
            "additionalProperties": False}}, "required": ["name", "arguments"], "additionalProperties": False},
        {"type": "object", "properties": {"name": {"const": "time"}, "arguments": {"type": "object", "properties": {},
         "additionalProperties": False}}, "required": ["name", "arguments"], "additionalProperties": False}]}}],
        "triggers": ["<tool_"]},
}


def all_guides() -> list[tuple[str, str, str]]:
    """(name, guide type, guide text) of every shared guide, plus the schema-free ``json`` type."""
    out = [(f"schema:{k}", "json_schema", json.dumps(v)) for k, v in SCHEMAS.items()]
    out += [(f"regex:{k}", "regex", v) for k, v in REGEXES.items()]
    out += [(f"ebnf:{k}", "ebnf_grammar", v) for k, v in GRAMMARS.items()]
    out += [(f"tag:{k}", "structural_tag", json.dumps(v)) for k, v in STRUCTURAL_TAGS.items()]
    out.append(("json", "json", ""))
    return out
