"""Sequence.token_ids_between: any span of prompt + output, continued by the drafts (a verify step's tail), against
slicing the concatenation it avoids building."""
from __future__ import annotations

import random

from backend.core.sequence import Sequence
from contracts.sampling_params import SamplingParams


def test_token_ids_between_equals_slicing_prompt_output_and_drafts():
    rng = random.Random(0)
    for _ in range(2000):
        seq = Sequence(seq_id=0, request_id="r", seq_index=0,
                       prompt_token_ids=[rng.randrange(50) for _ in range(rng.randrange(1, 12))],
                       params=SamplingParams())
        seq.output_token_ids.extend(rng.randrange(50) for _ in range(rng.randrange(0, 8)))
        seq.draft_token_ids = [rng.randrange(50) for _ in range(rng.randrange(0, 5))]
        stream = seq.all_token_ids + seq.draft_token_ids
        start = rng.randrange(0, len(stream) + 1)
        end = rng.randrange(start, len(stream) + 1)
        assert seq.token_ids_between(start, end) == stream[start:end], (start, end)
