"""JSON schemas that xgrammar 0.2.9 enforces exactly: the allow-list, and the form it compiles.

xgrammar compiles some keywords without enforcing them, so an output it allows could fail the
schema. Measured on 0.2.9 (``tests/grammar/test_schema.py`` keeps the evidence):
- ignored outright: ``uniqueItems``, ``not``, ``dependentRequired``, ``dependentSchemas``,
  ``contains``, ``if``/``then``/``else``, ``contentEncoding``, non-local ``$ref``;
- approximated: ``oneOf`` (as ``anyOf``), ``allOf`` with several branches;
- dropped with a warning: ``minLength``/``maxLength`` beside ``pattern`` or ``format``,
  ``multipleOf`` on numbers or with a fraction;
- dropped silently: type-specific keywords without their ``type`` (``{"minimum": 3}`` admits 2),
  siblings of ``enum``/``const``/``anyOf``/``$ref``, ``required`` names missing from ``properties``;
- loose: ``format`` ``date``/``date-time`` admit 2024-02-30, ``ipv4`` admits leading zeros, and a
  length-bounded string admits raw control characters (invalid JSON).
``check_schema`` rejects all of these with a message naming the keyword and where it is; the
length-bounded string is repaired where the schema is compiled (``guides.schema_grammar``).
"""
from __future__ import annotations

import math
import re
from typing import Any

from grammar.errors import GUIDE, GuideError
from grammar.regex import compile_python

ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$comment", "$schema", "$id",
                         "deprecated", "readOnly", "writeOnly"})
DEFINITIONS = ("$defs", "definitions")
TYPES = frozenset({"string", "integer", "number", "boolean", "null", "array", "object"})
STRING_KEYWORDS = frozenset({"minLength", "maxLength", "pattern", "format"})
NUMBER_KEYWORDS = frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"})
ARRAY_KEYWORDS = frozenset({"items", "prefixItems", "minItems", "maxItems"})
OBJECT_KEYWORDS = frozenset({"properties", "required", "additionalProperties", "patternProperties",
                             "propertyNames", "minProperties", "maxProperties"})
KEYWORDS_OF_TYPE = {"string": STRING_KEYWORDS, "integer": NUMBER_KEYWORDS, "number": NUMBER_KEYWORDS - {"multipleOf"},
                    "array": ARRAY_KEYWORDS, "object": OBJECT_KEYWORDS}
TYPED_KEYWORDS = STRING_KEYWORDS | NUMBER_KEYWORDS | ARRAY_KEYWORDS | OBJECT_KEYWORDS
ALLOWED = ANNOTATIONS | TYPED_KEYWORDS | {"type", "enum", "const", "anyOf", "$ref", *DEFINITIONS}
# formats whose xgrammar pattern is at least as strict as jsonschema's format checker
FORMATS = frozenset({"email", "uuid", "ipv6"})
_WHY_NOT = {
    "uniqueItems": "xgrammar does not enforce it",
    "not": "xgrammar does not enforce it",
    "dependentRequired": "xgrammar does not enforce it",
    "dependentSchemas": "xgrammar does not enforce it",
    "contains": "xgrammar does not enforce it",
    "minContains": "xgrammar does not enforce it",
    "maxContains": "xgrammar does not enforce it",
    "if": "xgrammar does not enforce conditionals",
    "then": "xgrammar does not enforce conditionals",
    "else": "xgrammar does not enforce conditionals",
    "oneOf": "xgrammar enforces it as anyOf; use anyOf with disjoint branches",
    "allOf": "xgrammar does not enforce several branches; merge them into one schema",
    "unevaluatedProperties": "not on the supported list; use additionalProperties",
    "unevaluatedItems": "not on the supported list; use items",
    "additionalItems": "not on the supported list; use prefixItems and items",
    "contentEncoding": "xgrammar does not enforce it",
    "contentMediaType": "xgrammar does not enforce it",
}
INT64 = 2**63 - 1


def check_schema(schema: Any) -> None:
    """Raise ``GuideError`` (field ``guided_decoding_guide``) unless xgrammar enforces every keyword."""
    if schema is False:
        raise GuideError(GUIDE, "the schema false admits no value")
    if not isinstance(schema, (dict, bool)):
        raise GuideError(GUIDE, "a JSON schema must be an object (or true)")
    _check(schema, "")


# ---- the walk ------------------------------------------------------------------------------------

def _fail(path: str, message: str) -> GuideError:
    return GuideError(GUIDE, f"schema at {path or '/'}: {message}")


def _check(s: Any, path: str, implied_type: str | None = None) -> None:
    """``implied_type``: the type a schema's position implies (property names are strings)."""
    if isinstance(s, bool):
        return
    if not isinstance(s, dict):
        raise _fail(path, f"a subschema must be an object or a boolean, got {type(s).__name__}")
    for key in s:
        if key not in ALLOWED:
            why = _WHY_NOT.get(key, "not on the list of keywords xgrammar enforces (see docs/api.md)")
            raise _fail(path, f"unsupported keyword {key!r}: {why}")
    for d in DEFINITIONS:
        if d in s:
            if not isinstance(s[d], dict):
                raise _fail(path, f"{d} must be an object")
            for name, sub in s[d].items():
                _check(sub, f"{path}/{d}/{name}")
    own = set(s) - ANNOTATIONS - set(DEFINITIONS)
    for combinator in ("$ref", "anyOf", "enum", "const"):
        if combinator in own:
            allowed_siblings = {combinator, "type"} if combinator in ("enum", "const") else {combinator}
            extra = sorted(own - allowed_siblings)
            if extra:
                raise _fail(path, f"{combinator!r} cannot have sibling keywords {extra} (xgrammar drops them); "
                                  "move them into the referenced or listed schemas")
    if "$ref" in s:
        ref = s["$ref"]
        if not isinstance(ref, str) or not (ref == "#" or ref.startswith("#/")):
            raise _fail(path, f"$ref {ref!r}: only local references ('#' or '#/...') are supported")
        return
    if "anyOf" in s:
        branches = s["anyOf"]
        if not isinstance(branches, list) or not branches:
            raise _fail(path, "anyOf must be a non-empty list")
        for i, sub in enumerate(branches):
            _check(sub, f"{path}/anyOf/{i}")
        return
    if "enum" in s and (not isinstance(s["enum"], list) or not s["enum"]):
        raise _fail(path, "enum must be a non-empty list")
    types = _types(s, path) or ([implied_type] if implied_type else [])
    typed = own & TYPED_KEYWORDS
    if typed:
        if len(types) != 1:
            raise _fail(path, f"keywords {sorted(typed)} need a single \"type\" beside them (xgrammar drops them "
                              f"otherwise)")
        (t,) = types
        wrong = sorted(typed - KEYWORDS_OF_TYPE.get(t, frozenset()))
        if wrong:
            if t == "number" and "multipleOf" in wrong:
                raise _fail(path, "multipleOf is enforced only on integers (xgrammar ignores it on numbers)")
            raise _fail(path, f"keywords {wrong} do not apply to type {t!r}")
        {"string": _check_string, "integer": _check_number, "number": _check_number, "array": _check_array,
         "object": _check_object}[t](s, path, t)


def _types(s: dict, path: str) -> list[str]:
    if "type" not in s:
        return []
    t = s["type"]
    types = t if isinstance(t, list) else [t]
    if not types or any(x not in TYPES for x in types) or len(set(types)) != len(types):
        raise _fail(path, f"type must be one of {sorted(TYPES)} or a list of them, got {t!r}")
    return types


def _check_count(s: dict, path: str, *names: str) -> None:
    for name in names:
        if name in s:
            v = s[name]
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise _fail(path, f"{name} must be a non-negative integer, got {v!r}")
    lo, hi = names
    if lo in s and hi in s and s[lo] > s[hi]:
        raise _fail(path, f"{lo} ({s[lo]}) exceeds {hi} ({s[hi]})")


def _check_pattern(p: Any, path: str, what: str) -> None:
    if not isinstance(p, str):
        raise _fail(path, f"{what} must be a string")
    try:
        compile_python(p)
    except re.error as e:
        raise _fail(path, f"{what} {p!r} is not a valid regular expression ({e})") from None


def _check_string(s: dict, path: str, _t: str) -> None:
    _check_count(s, path, "minLength", "maxLength")
    lengths = [k for k in ("minLength", "maxLength") if k in s]
    if "pattern" in s:
        _check_pattern(s["pattern"], path, "pattern")
    if "format" in s:
        if s["format"] not in FORMATS:
            raise _fail(path, f"format {s['format']!r} is not enforced exactly by xgrammar (supported: "
                              f"{sorted(FORMATS)}); use a pattern")
    if lengths and ("pattern" in s or "format" in s):
        other = "pattern" if "pattern" in s else "format"
        raise _fail(path, f"{'/'.join(lengths)} beside {other}: xgrammar drops the lengths; put them in the pattern "
                          f"(e.g. ^...{{m,n}}$)")
    if "pattern" in s and "format" in s:
        raise _fail(path, "pattern beside format: xgrammar enforces only one of them")


def _check_number(s: dict, path: str, t: str) -> None:
    for name in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"):
        if name not in s:
            continue
        v = s[name]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise _fail(path, f"{name} must be a finite number, got {v!r}")
        if t == "integer":
            if v != int(v):
                raise _fail(path, f"{name} of an integer must be a whole number, got {v!r}")
            if abs(v) > INT64:
                raise _fail(path, f"{name} {v!r} is outside the 64-bit integers xgrammar supports")
    if "multipleOf" in s and not s["multipleOf"] > 0:
        raise _fail(path, f"multipleOf must be > 0, got {s['multipleOf']!r}")


def _check_array(s: dict, path: str, _t: str) -> None:
    _check_count(s, path, "minItems", "maxItems")
    if "items" in s:
        if isinstance(s["items"], list):
            raise _fail(path, "items as a list is the old tuple form; use prefixItems")
        _check(s["items"], f"{path}/items")
    if "prefixItems" in s:
        if not isinstance(s["prefixItems"], list):
            raise _fail(path, "prefixItems must be a list")
        for i, sub in enumerate(s["prefixItems"]):
            _check(sub, f"{path}/prefixItems/{i}")


def _check_object(s: dict, path: str, _t: str) -> None:
    _check_count(s, path, "minProperties", "maxProperties")
    props = s.get("properties", {})
    if not isinstance(props, dict):
        raise _fail(path, "properties must be an object")
    for name, sub in props.items():
        _check(sub, f"{path}/properties/{name}")
    required = s.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise _fail(path, "required must be a list of property names")
    missing = [r for r in required if r not in props]
    if missing:
        raise _fail(path, f"required names {missing} are not in properties (xgrammar ignores them)")
    if "additionalProperties" in s:
        _check(s["additionalProperties"], f"{path}/additionalProperties")
    if "patternProperties" in s:
        if not isinstance(s["patternProperties"], dict):
            raise _fail(path, "patternProperties must be an object")
        for pat, sub in s["patternProperties"].items():
            _check_pattern(pat, path, "patternProperties key")
            _check(sub, f"{path}/patternProperties/{pat}")
    if "propertyNames" in s:
        _check(s["propertyNames"], f"{path}/propertyNames", implied_type="string")
