"""tools/client.py: the guided-decoding flags become the ensemble's guide inputs."""
from __future__ import annotations

import argparse

import pytest

from tools.client import guide_options, main


def ns(**kw):
    base = dict(json=False, json_schema=None, regex=None, grammar=None)
    return argparse.Namespace(**{**base, **kw})


def test_guide_flags(tmp_path):
    schema = tmp_path / "s.json"
    schema.write_text('{"type": "integer"}')
    grammar = tmp_path / "g.ebnf"
    grammar.write_text('root ::= "a"')
    assert guide_options(ns()) == {}
    assert guide_options(ns(json=True)) == {"guided_decoding_guide_type": "json"}
    assert guide_options(ns(json_schema=str(schema))) == {"guided_decoding_guide_type": "json_schema",
                                                          "guided_decoding_guide": '{"type": "integer"}'}
    assert guide_options(ns(regex="[0-9]+")) == {"guided_decoding_guide_type": "regex",
                                                 "guided_decoding_guide": "[0-9]+"}
    assert guide_options(ns(grammar=str(grammar)))["guided_decoding_guide"] == 'root ::= "a"'


def test_one_guide_at_a_time():
    with pytest.raises(SystemExit):
        main(["x", "--json", "--regex", "a"])
