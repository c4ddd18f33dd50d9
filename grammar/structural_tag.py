"""The ``structural_tag`` guide: free text in which each tagged region follows a JSON schema.

The guide is vLLM's structural-tag object::

    {"structures": [{"begin": "<tool_call>", "schema": {...}, "end": "</tool_call>"}, ...],
     "triggers": ["<tool_call>"]}

The output is free text until it produces a trigger; from there it must complete one structure's
``begin``, then a JSON value valid for that structure's schema (compact, as every JSON guide here),
then its ``end``; then free text again. Every ``begin`` starts with one of the triggers. This is how a
tool call in a free-form answer is constrained once it starts (the OpenAI API's ``tool_choice: auto``)
without constraining the text around it. The grammar is xgrammar's ``triggered_tags`` format, whose
printed EBNF (a ``TagDispatch`` rule) is what the engine compiles.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import xgrammar as xgr
from xgrammar import structural_tag as st

from grammar.errors import GUIDE, GuideError

MAX_STRUCTURES = 128


@dataclass(frozen=True)
class Structure:
    begin: str
    schema: str       # the schema as JSON text
    end: str


@dataclass(frozen=True)
class StructuralTagSpec:
    structures: tuple[Structure, ...]
    triggers: tuple[str, ...]


def _text(value, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise GuideError(GUIDE, f"{where}: must be a non-empty string")
    return value


def parse_structural_tag(text: str) -> StructuralTagSpec:
    """The guide's shape checked (``GuideError`` naming the key at fault); the schemas are not yet."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise GuideError(GUIDE, f"a structural tag must be a JSON object ({e})") from None
    if not isinstance(obj, dict):
        raise GuideError(GUIDE, "a structural tag must be a JSON object")
    extra = sorted(set(obj) - {"structures", "triggers", "type"})
    if extra:
        raise GuideError(GUIDE, f"unknown key {extra[0]!r} (expected structures, triggers)")
    structures, triggers = obj.get("structures"), obj.get("triggers")
    if not isinstance(structures, list) or not 1 <= len(structures) <= MAX_STRUCTURES:
        raise GuideError(GUIDE, f"structures: must be a list of 1 to {MAX_STRUCTURES} objects")
    if not isinstance(triggers, list) or not triggers:
        raise GuideError(GUIDE, "triggers: must be a non-empty list of strings")
    trig = tuple(_text(t, f"triggers[{i}]") for i, t in enumerate(triggers))
    out = []
    for i, s in enumerate(structures):
        if not isinstance(s, dict) or set(s) != {"begin", "schema", "end"}:
            raise GuideError(GUIDE, f"structures[{i}]: must be an object with exactly begin, schema and end")
        begin = _text(s["begin"], f"structures[{i}].begin")
        if not any(begin.startswith(t) for t in trig):
            raise GuideError(GUIDE, f"structures[{i}].begin: {begin!r} does not start with any of the triggers")
        if not isinstance(s["schema"], (dict, bool)):
            raise GuideError(GUIDE, f"structures[{i}].schema: must be a JSON schema (an object or a boolean)")
        out.append(Structure(begin, json.dumps(s["schema"], ensure_ascii=False), _text(s["end"], f"structures[{i}].end")))
    return StructuralTagSpec(tuple(out), trig)


def tag_grammar(spec: StructuralTagSpec, schema_grammars: list[str]) -> str:
    """The EBNF of free text with ``spec``'s tagged regions; ``schema_grammars[i]`` is structure i's
    schema as EBNF (``guides.schema_grammar``)."""
    tags = [st.TagFormat(begin=s.begin, content=st.GrammarFormat(grammar=g), end=s.end)
            for s, g in zip(spec.structures, schema_grammars)]
    try:
        grammar = xgr.Grammar.from_structural_tag(st.StructuralTag(
            format=st.TriggeredTagsFormat(triggers=list(spec.triggers), tags=tags)))
    except Exception as e:   # xgrammar's InvalidStructuralTagError and pydantic's ValidationError say why
        raise GuideError(GUIDE, f"a structural tag xgrammar cannot compile: {str(e).strip().splitlines()[0]}") from None
    return str(grammar)
