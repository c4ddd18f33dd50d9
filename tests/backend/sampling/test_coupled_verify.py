"""The runner's greedy verification shortcut (``coupled_verify`` over argmaxes) equals the sampler's verify for greedy targets."""
from __future__ import annotations

import torch

from backend.core.sequence import Sequence
from backend.sampling.rejection import coupled_verify
from backend.sampling.sampler import Sampler
from contracts.sampling_params import SamplingParams

VOCAB = 50


def test_coupled_verify_matches_the_sampler():
    gen = torch.Generator().manual_seed(0)
    sampler = Sampler(vocab_size=VOCAB, device=torch.device("cpu"), seed=0, eos_token_ids=[1])
    for trial in range(40):
        counts = [int(c) for c in torch.randint(0, 5, (3,), generator=gen)]
        logits = torch.randn(sum(counts) + len(counts), VOCAB, generator=gen)
        argmax = logits.argmax(-1).tolist()
        drafts, row = [], 0
        for k in counts:   # drafts that follow the argmax for a random number of positions, then diverge
            follow = int(torch.randint(0, k + 1, (1,), generator=gen))
            d = [argmax[row + j] if j < follow else (argmax[row + j] + 1) % VOCAB for j in range(k)]
            drafts.append(d)
            row += k + 1
        seqs = [Sequence(i, f"r{i}", 0, [0, 5, 6], SamplingParams(temperature=0.0)) for i in range(len(counts))]
        q = None
        if trial % 2:   # sampled drafts: their distributions do not matter to a greedy target
            q = [torch.softmax(torch.randn(k, VOCAB, generator=gen), -1) if k else None for k in counts]
        expected = sampler.verify(logits, seqs, drafts, q).token_ids
        assert coupled_verify(argmax, drafts) == expected, (counts, drafts)
