"""Qwen3 and Phi-3 through tritonserver: a random Qwen3 and a random Phi-4-mini-layout checkpoint (written by
transformers' own config classes) each served with a PEFT adapter on the family's own target modules (Qwen3's split
q/k/v/o/gate/up/down, Phi-3's fused qkv_proj / gate_up_proj) and the e2e suite's n-gram speculation. Concurrent
greedy streams under the adapter and under none equal transformers + PEFT; seeded sampled requests replay exactly,
streamed and not, alone and among 31, with speculation on and off per request (tests/e2e/test_seeded_replay.py's
check, on this server)."""
from __future__ import annotations

import pytest

from cli.client import build_inputs
from tests.e2e import test_seeded_replay as seeded_replay
from tests.e2e.conftest import E2EServer, start_e2e_server, stop_e2e_server
from tests.e2e.helpers import Stream
from tests.helpers.families import PEFT_TARGETS, make_family_checkpoint
from tests.helpers.lora import peft_greedy

PROMPTS = ["def fibonacci(n):", "import os\nimport", "class Stack:\n    def", "for i in range(",
           "x = [1, 2, 3]\ny =", "return sorted("]
NEW_TOKENS = 12


@pytest.fixture(scope="module", params=["qwen3", "phi4_partial"])
def family_server(request, tmp_path_factory):
    from tools.make_lora_adapter import make_adapter

    name, root = request.param, tmp_path_factory.mktemp(request.param)
    base = make_family_checkpoint(root / "ckpt", name)
    adapter = make_adapter(base, root / "lora", rank=8, alpha=16, targets=PEFT_TARGETS[name], scale=0.1, seed=11)
    srv = start_e2e_server(root, base, llm={"lora_adapters": f"fam8={adapter}"})
    yield name, E2EServer(srv, base), adapter
    stop_e2e_server(srv)


@pytest.fixture(scope="module")
def server(family_server) -> E2EServer:
    """This module's server (the suite's log-on-failure fixture reads it)."""
    return family_server[1]


def test_the_adapter_matches_peft_through_the_server(family_server):
    from preprocess.tokenizer import load_tokenizer

    name, server, adapter = family_server
    tok = load_tokenizer(server.model_path)
    ids = [tok.encode(p) for p in PROMPTS]
    expected = {n: [tok.decode(t) for t in peft_greedy(server.model_path, folder, ids, NEW_TOKENS)]
                for n, folder in (("fam8", adapter), (None, None))}
    assert sum(a != b for a, b in zip(expected["fam8"], expected[None])) >= len(PROMPTS) / 2, name
    with Stream(server.grpc_url) as s:
        rids = {s.send(build_inputs(p, NEW_TOKENS, min_tokens=NEW_TOKENS, temperature=0.0, stream=True,
                                    exclude_input_in_output=True, lora_name=n)): (n, i)
                for i, p in enumerate(PROMPTS) for n in ("fam8", None)}
        results = s.wait(list(rids), 180)
    for rid, (n, i) in rids.items():
        assert results[rid].error is None, results[rid].error
        assert results[rid].text == expected[n][i], f"{name}: adapter {n}, prompt {i}"


def test_seeded_requests_replay_every_way(family_server):
    seeded_replay.test_the_same_seeded_request_gives_the_same_text_every_way(family_server[1])
