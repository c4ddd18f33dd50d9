"""Check a finished output against its guide, independently of the grammar that produced it.

- ``json``: the text parses as one JSON value (strict: no control characters in strings);
- ``json_schema``: it parses and validates with ``jsonschema`` (the schema's own draft), with
  ``pattern`` read as xgrammar reads it (ECMAScript classes) and the formats of the allow-list checked;
- ``regex``: the whole text matches (``re.fullmatch`` of ``regex.python_pattern``);
- ``ebnf_grammar``: xgrammar's string matcher accepts the whole text (character level, no tokenizer);
- ``structural_tag``: the same, over the guide's grammar (structural_tag.py), and every tagged region's
  JSON validates against its structure's schema as ``json_schema`` checks it.

A guided output that finished with ``stop`` and fails here is a bug in the grammar layer or in
xgrammar: postprocess reports it as an error, logs it, and counts it.
"""
from __future__ import annotations

import json
from functools import lru_cache

from grammar.regex import compile_python
from grammar.schema import FORMATS


def check_output(kind: str, guide: str, text: str) -> str | None:
    """None when ``text`` satisfies the guide, else a short reason."""
    if kind in ("json", "json_schema"):
        try:
            value = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as e:
            return f"not valid JSON ({e})"
        if kind == "json":
            return None
        errors = sorted(_schema_validator(guide).iter_errors(value), key=lambda e: list(e.path))
        if errors:
            e = errors[0]
            return f"does not match the schema at /{'/'.join(str(p) for p in e.path)}: {e.message}"
        return None
    if kind == "regex":
        return None if compile_python(guide).fullmatch(text) else "does not match the regular expression in full"
    if kind == "ebnf_grammar":
        matcher = _ebnf_matcher(guide)
        return None if matcher.accept_string(text) and matcher.is_terminated() else "not derivable from the grammar"
    if kind == "structural_tag":
        return _check_tagged(guide, text)
    return f"unknown guide type {kind!r}"


@lru_cache(maxsize=256)
def _schema_validator(schema_text: str):
    from jsonschema import FormatChecker, ValidationError, validators

    def pattern(validator, patrn, instance, schema):
        if validator.is_type(instance, "string") and not compile_python(patrn).search(instance):
            yield ValidationError(f"{instance!r} does not match {patrn!r}")

    schema = json.loads(schema_text)
    base = validators.validator_for(schema)
    cls = validators.extend(base, {"pattern": pattern})
    return cls(schema, format_checker=FormatChecker(formats=sorted(FORMATS)))


def _check_tagged(guide: str, text: str) -> str | None:
    from grammar.guides import structural_tag_source
    from grammar.structural_tag import parse_structural_tag

    matcher = _ebnf_matcher(structural_tag_source(guide))
    if not (matcher.accept_string(text) and matcher.is_terminated()):
        return "not derivable from the structural tag's grammar"
    spec = parse_structural_tag(guide)
    for s in spec.structures:
        pos = text.find(s.begin)
        while pos >= 0:
            end = text.find(s.end, pos + len(s.begin))
            if end < 0:
                break
            body = text[pos + len(s.begin):end]
            reason = check_output("json_schema", s.schema, body) if _is_json(body) else None
            if reason is not None:
                return f"a {s.begin!r} region {reason}"
            pos = text.find(s.begin, end + len(s.end))
    return None


def _is_json(body: str) -> bool:
    try:
        json.loads(body)
    except (json.JSONDecodeError, RecursionError):
        return False
    return True


@lru_cache(maxsize=64)
def _ebnf_compiled(grammar: str):
    import xgrammar as xgr

    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo([]), max_threads=1, cache_enabled=False)
    return compiler.compile_grammar(grammar)


def _ebnf_matcher(grammar: str):
    import xgrammar as xgr

    return xgr.GrammarMatcher(_ebnf_compiled(grammar), terminate_without_stop_token=True)
