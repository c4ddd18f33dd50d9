"""docs/api.md's example requests give the documented answers on the real server (the table is read
from the docs, so a changed answer fails here until the docs say it)."""
from __future__ import annotations

import json

import pytest

from tests.e2e.helpers import raw_input, run_inputs
from tests.helpers.api_docs import config_tensors, examples
from cli.client import to_array

EXAMPLES = examples()
TYPES = {name: t.type for name, t in config_tensors("input").items()}


def inputs_for(values: dict) -> list:
    out = []
    for name, value in values.items():
        if name == "messages" and not isinstance(value, str):
            value = json.dumps(value)
        out.append(raw_input(name, to_array(name, value), TYPES[name]))
    return out


@pytest.mark.parametrize("example", EXAMPLES, ids=[json.dumps(e.inputs)[:60] for e in EXAMPLES])
def test_documented_example(server, example):
    res = run_inputs(server.grpc_url, inputs_for(example.inputs), timeout=120)
    if example.error is not None:
        assert res.error is not None, f"expected the error {example.error!r}, got text {res.text!r}"
        assert example.error in res.error, res.error
        return
    assert res.error is None, res.error
    assert res.num_final == 1, "every stream ends with exactly one final response"
    if example.empty:
        assert res.text == "" and not res.finish_reason and res.num_output_tokens == 0
        return
    n = example.inputs.get("num_return_sequences", 1)
    by_seq: dict[int, list] = {}
    for c in res.chunks:
        if c.text or c.finish_reason or c.num_output_tokens:
            by_seq.setdefault(c.sequence_index, []).append(c)
    assert sorted(by_seq) == list(range(n))
    for seq, chunks in by_seq.items():
        if example.finish_reason is not None:
            assert chunks[-1].finish_reason == example.finish_reason, (seq, [c.finish_reason for c in chunks])
            assert all(not c.finish_reason for c in chunks[:-1]), "finish_reason is '' until the sequence ends"
        if example.num_output_tokens is not None:
            assert max(c.num_output_tokens for c in chunks) == example.num_output_tokens
