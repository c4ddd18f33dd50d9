"""The guide types, checked before engine time, and the text xgrammar compiles for each.

| type | guide text | compiled as |
| --- | --- | --- |
| ``json`` | none (ignored) | any JSON value, compact: ``schema_grammar("{}")`` |
| ``json_schema`` | a JSON schema on the allow-list of ``schema.py`` | ``schema_grammar(schema)``, compact |
| ``regex`` | a pattern (ECMAScript classes, as xgrammar reads it), matched in full | the pattern |
| ``ebnf_grammar`` | GBNF/EBNF as xgrammar reads it, with a ``root`` rule | the grammar |
| ``structural_tag`` | ``{"structures": [{"begin", "schema", "end"}], "triggers"}`` (structural_tag.py) | free text with each tagged region's schema, compact |

"Compact": separators ``", "`` and ``": "`` and no other whitespace; with free whitespace a sampled
output can wander into spaces and newlines until ``max_tokens``.

JSON is compiled through xgrammar's own EBNF for the schema, with two repairs of its string
characters: xgrammar 0.2.9 writes a length-bounded string's characters as ``[^"\\\r\n]``, which
admits raw control characters (invalid JSON), and both that class and the one of other strings
admit UTF-16 surrogates (invalid UTF-8, which the detokenizer shows as U+FFFD and so miscounts
lengths); ``schema_grammar`` narrows both classes. (A
``pattern`` goes to xgrammar's JSON-string regex matcher, which admits overlong UTF-8 sequences where
the pattern admits non-ASCII characters: a byte-level model rarely emits them, and the output check
catches them.)
"""
from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass

import xgrammar as xgr

from contracts.sampling_params import GUIDE_TYPES
from grammar.errors import GUIDE, GUIDE_TYPE, GuideError
from grammar.nesting import DEFAULT_MAX_DEPTH, group_depth, json_depth
from grammar.regex import compile_python
from grammar.schema import check_schema
from grammar.structural_tag import parse_structural_tag, tag_grammar

ANY_JSON = "{}"                  # the schema every JSON value satisfies
# xgrammar 0.2.9's classes for string characters (length-bounded strings, other strings), and their
# repairs: no control characters (JSON forbids them raw), no surrogates (not UTF-8); '"' and '\\'
# stay out as before (escapes have their own rule)
STRING_CHAR_REPAIRS = (
    (r'(([^\"\\\r\n]))', r'(([^\0-\x1f\"\\\ud800-\udfff]))'),
    (r'[^\0-\x1f\"\\\r\n]', r'[^\0-\x1f\"\\\ud800-\udfff]'),
)
MAX_GUIDE_CHARS = 200_000
_XGR_LOG_PREFIX = re.compile(r"^\s*\[[\d:.]+\]\s+\S+:\d+:\s*")


@dataclass(frozen=True)
class PreparedGuide:
    """What xgrammar compiles: ``kind`` as requested, ``source`` the text handed to it."""

    kind: str
    source: str


def xgrammar_message(e: Exception) -> str:
    """xgrammar's error text without its C++ log prefix (time stamp, source file and line)."""
    lines = [_XGR_LOG_PREFIX.sub("", line).strip() for line in str(e).strip().splitlines()]
    return " ".join(line for line in lines if line) or type(e).__name__


def prepare_guide(kind: str | None, guide: str | None, *, max_chars: int = MAX_GUIDE_CHARS,
                  max_depth: int = DEFAULT_MAX_DEPTH) -> PreparedGuide:
    """Check a guide and return what xgrammar compiles for it; ``GuideError`` naming the field.

    Cheap: JSON parsing, the schema allow-list, ``re`` and xgrammar's own parsers (no tokenizer).
    ``max_chars`` and ``max_depth`` (preprocess's ``max_guide_chars`` and ``max_guide_depth``) bound
    the text and its nesting before any recursive parser reads it (grammar/nesting.py).
    """
    if kind is None or kind == "":
        if guide:
            raise GuideError(GUIDE_TYPE, "guided_decoding_guide was given without a type")
        raise GuideError(GUIDE_TYPE, "required for guided decoding")
    if kind not in GUIDE_TYPES:
        raise GuideError(GUIDE_TYPE, f"unknown type {kind!r} (expected {', '.join(GUIDE_TYPES[:-1])} or {GUIDE_TYPES[-1]})")
    guide = guide or ""
    if len(guide) > max_chars:
        raise GuideError(GUIDE, f"{len(guide)} characters, more than the limit of {max_chars} (max_guide_chars)")
    if kind == "json":
        return PreparedGuide(kind, any_json_grammar())
    if not guide.strip():
        raise GuideError(GUIDE, f"required when guided_decoding_guide_type is {kind!r}")
    if kind in ("json_schema", "structural_tag"):
        depth = json_depth(guide)
    else:
        depth = group_depth(guide, quotes="\"'" if kind == "ebnf_grammar" else "")
    if depth > max_depth:
        raise GuideError(GUIDE, f"nested {depth} levels deep, more than the limit of {max_depth} (max_guide_depth)")
    try:
        return _prepare(kind, guide)
    except RecursionError:   # a backstop: the depth check above keeps every parser far from the limit
        raise GuideError(GUIDE, "nested too deeply to parse") from None


def _prepare(kind: str, guide: str) -> PreparedGuide:
    if kind == "json_schema":
        return PreparedGuide(kind, _prepare_schema(guide))
    if kind == "regex":
        try:
            compile_python(guide)
        except re.error as e:
            raise GuideError(GUIDE, f"not a valid regular expression ({e})") from None
        _parse(xgr.Grammar.from_regex, guide, "not a regular expression xgrammar can compile")
        return PreparedGuide(kind, guide)
    if kind == "structural_tag":
        return PreparedGuide(kind, structural_tag_source(guide))
    _parse(xgr.Grammar.from_ebnf, guide, "not a valid EBNF grammar")
    return PreparedGuide(kind, guide)


def structural_tag_source(guide: str) -> str:
    """The EBNF of a ``structural_tag`` guide, each structure's schema checked as a ``json_schema`` guide."""
    spec = parse_structural_tag(guide)
    grammars = []
    for i, s in enumerate(spec.structures):
        try:
            grammars.append(_prepare_schema(s.schema))
        except GuideError as e:
            raise GuideError(GUIDE, f"structures[{i}].schema: {e.message}") from None
    return tag_grammar(spec, grammars)


def check_guide(kind: str | None, guide: str | None, *, max_chars: int = MAX_GUIDE_CHARS,
                max_depth: int = DEFAULT_MAX_DEPTH) -> None:
    """``prepare_guide`` for callers that only validate (preprocess)."""
    prepare_guide(kind, guide, max_chars=max_chars, max_depth=max_depth)


def _prepare_schema(text: str) -> str:
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as e:
        raise GuideError(GUIDE, f"not a valid JSON schema: not JSON ({e})") from None
    check_schema(schema)
    # lazily: a schema guide's compile and the output checks need jsonschema, nothing else
    from jsonschema import exceptions, validators

    try:
        validators.validator_for(schema).check_schema(schema)
    except exceptions.SchemaError as e:
        where = "/" + "/".join(str(p) for p in e.path)
        raise GuideError(GUIDE, f"not a valid JSON schema at {where}: {e.message}") from None
    return schema_grammar(json.dumps(schema, ensure_ascii=False))


@functools.cache
def any_json_grammar() -> str:
    """``schema_grammar(ANY_JSON)``, built once: every ``json`` guide compiles this text."""
    return schema_grammar(ANY_JSON)


def schema_grammar(schema_text: str) -> str:
    """The EBNF xgrammar compiles for a schema: compact JSON, length-bounded strings repaired."""
    try:
        ebnf = str(xgr.Grammar.from_json_schema(schema_text, any_whitespace=False))
    except Exception as e:
        raise GuideError(GUIDE, f"a JSON schema xgrammar cannot compile: {xgrammar_message(e)}") from None
    for loose, strict in STRING_CHAR_REPAIRS:
        ebnf = ebnf.replace(loose, strict)
    return ebnf


def _parse(parse, text: str, what: str) -> None:
    try:
        parse(text)
    except Exception as e:  # xgrammar raises RuntimeError / ValueError / its own types with the reason
        raise GuideError(GUIDE, f"{what}: {xgrammar_message(e)}") from None
