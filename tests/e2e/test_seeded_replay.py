"""Seeded sampled requests replay exactly through the pipeline with the shipped speculation (adaptive n-gram):
streamed and not, alone and among 31 concurrent ones, with speculation on and off per request (docs/sampling.md).
"""
from __future__ import annotations

from cli.client import build_inputs
from tests.e2e.helpers import Stream, run

PROMPTS = ["def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
           "The cat sat on the mat. The dog sat on the log. The bird",
           'items = ["a", "b", "c"]\nfor item in items:\n    print(item)\nfor item in']
SEEDS = [3, 17, 101, 4242, 99991, 2**63 + 5]
MAX_TOKENS = 48


def options(seed: int) -> dict:
    return dict(temperature=1.2, top_p=0.95, seed=seed, exclude_input_in_output=True)


def cases():
    return [(p, s) for p in PROMPTS for s in SEEDS]


def alone(url: str, prompt: str, seed: int, **extra) -> str:
    res = run(url, prompt, MAX_TOKENS, **options(seed), **extra)
    assert res.error is None, res.error
    return res.text


def test_the_same_seeded_request_gives_the_same_text_every_way(server):
    url = server.grpc_url
    reference = {c: alone(url, *c) for c in cases()}
    assert len(set(reference.values())) == len(reference), "different seeds should give different texts"
    for c in cases():
        assert alone(url, *c, stream=True) == reference[c], ("streamed", c)
        assert alone(url, *c, num_speculative_tokens=0) == reference[c], ("speculation off", c)
    # every case among 31 others (the others: the same prompts with other seeds), streamed and not
    with Stream(url) as s:
        ids = {}
        for i in range(32):
            p, seed = cases()[i % len(cases())]
            seed = seed if i < len(cases()) else seed + 1000 + i
            ids[s.send(build_inputs(p, MAX_TOKENS, **options(seed), stream=bool(i % 2)))] = (p, seed)
        results = s.wait(list(ids), timeout=300)
    for rid, c in ids.items():
        assert results[rid].error is None, results[rid].error
        if c in reference:
            assert results[rid].text == reference[c], ("among 31", c)
