"""The CLI's flags do the same through the gateway (``--gateway``) as against the ensemble: a guide, sampling
flags and the summary line, on the real server and gateway."""
from __future__ import annotations

import json

import pytest

from cli import client
from grammar import check_output
from bench.harness.guides import SCHEMAS


@pytest.fixture(scope="module")
def gateway(openai_gateway):
    return openai_gateway


def test_a_guide_and_sampling_flags_give_the_same_output_in_both_modes(server, gateway, tmp_path, capsys):
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(SCHEMAS["enums"]))
    argv = ["# a record as JSON\nrecord = ", "--json-schema", str(schema), "--max-tokens", "48", "--no-echo",
            "--temperature", "0.8", "--seed", "7", "--top-k", "20"]
    outputs = []
    for mode in (["--url", server.grpc_url], ["--gateway", "--url", gateway.target]):
        assert client.main([*argv, *mode]) == 0
        out = capsys.readouterr()
        assert check_output("json_schema", json.dumps(SCHEMAS["enums"]), out.out) is None, (mode, out.out)
        assert "finish_reason=stop" in out.err and "prompt_tokens=" in out.err, out.err
        outputs.append(out.out)
    assert outputs[0] == outputs[1]      # same seed, same guide, same text: the gateway honoured every flag
