"""The ``structural_tag`` guide: free text whose tagged regions follow their schemas."""
from __future__ import annotations

import json

import pytest

from grammar import check_output
from grammar.errors import GuideError
from grammar.guides import prepare_guide
from bench.harness.guides import STRUCTURAL_TAGS

PAREN = json.dumps(STRUCTURAL_TAGS["paren_int"])
TOOL = json.dumps(STRUCTURAL_TAGS["tool_call"])


@pytest.mark.parametrize("guide, text, ok", [
    (PAREN, "no brackets at all", True),
    (PAREN, "f(12) + g(0)", True),
    (PAREN, "f(n)", False),                       # a trigger opens the integer: `n` is not one
    (PAREN, "f(12", False),                       # an open region is not a finished output
    (TOOL, 'Sure.<tool_call>{"name": "weather", "arguments": {"city": "Oslo"}}</tool_call> done', True),
    (TOOL, '<tool_call>{"name": "time", "arguments": {}}</tool_call><tool_call>{"name": "time", '
           '"arguments": {}}</tool_call>', True),
    (TOOL, '<tool_call>{"name": "weather", "arguments": {}}</tool_call>', False),     # city is required
    (TOOL, '<tool_call>{"name": "wind", "arguments": {}}</tool_call>', False),        # no such tool
    (TOOL, '<tool_call>{"name":"time","arguments":{}}</tool_call>', False),           # not compact JSON
])
def test_output_check(guide, text, ok):
    assert (check_output("structural_tag", guide, text) is None) == ok


def test_the_guide_compiles_to_a_tag_dispatch_grammar():
    prepared = prepare_guide("structural_tag", TOOL)
    assert prepared.kind == "structural_tag" and "TagDispatch" in prepared.source


@pytest.mark.parametrize("guide, where", [
    ("[1]", "JSON object"),
    ('{"structures": [], "triggers": ["("]}', "structures: must be a list"),
    ('{"structures": [{"begin": "(", "schema": {}, "end": ")"}]}', "triggers:"),
    ('{"structures": [{"begin": "(", "schema": {}, "end": ")"}], "triggers": ["("], "x": 1}', "unknown key 'x'"),
    ('{"structures": [{"begin": "[", "schema": {}, "end": "]"}], "triggers": ["("]}', "structures[0].begin"),
    ('{"structures": [{"begin": "(", "schema": 3, "end": ")"}], "triggers": ["("]}', "structures[0].schema"),
    ('{"structures": [{"begin": "(", "schema": {}, "end": ""}], "triggers": ["("]}', "structures[0].end"),
    ('{"structures": [{"begin": "(", "end": ")"}], "triggers": ["("]}', "structures[0]: must be an object"),
    ('{"structures": [{"begin": "(", "schema": {"type": "string", "format": "hostname-x"}, "end": ")"}], '
     '"triggers": ["("]}', "structures[0].schema"),
])
def test_bad_guides_name_the_key(guide, where):
    with pytest.raises(GuideError) as e:
        prepare_guide("structural_tag", guide)
    assert e.value.field == "guided_decoding_guide" and where in e.value.message
