"""N-gram prompt lookup: the longest recurring suffix, its latest occurrence, the tokens after it (the
incremental index against a brute-force reference)."""
from __future__ import annotations

import numpy as np
import pytest

from backend.core.sequence import Sequence
from backend.spec_decode.ngram import BULK, NgramIndex, NgramProposer
from contracts.sampling_params import SamplingParams


def naive_match(ctx: list[int], n_min: int, n_max: int, k: int) -> tuple[list[int], int]:
    """Obviously correct reference: for n from n_max down, the latest earlier start of the last n tokens;
    the k tokens after it, copied one by one onto the end of the stream (a copy that reaches the stream's end
    reads its own output), and n (0: none)."""
    for n in range(min(n_max, len(ctx) - 1), n_min - 1, -1):
        suffix = ctx[-n:]
        for start in range(len(ctx) - n - 1, -1, -1):
            if ctx[start:start + n] == suffix:
                stream = list(ctx)                 # copy token by token, reading what the copy has written
                for i in range(k):
                    stream.append(stream[start + n + i])
                return stream[len(ctx):], n
    return [], 0


def naive_lookup(ctx: list[int], n_min: int, n_max: int, k: int) -> list[int]:
    return naive_match(ctx, n_min, n_max, k)[0]


@pytest.mark.parametrize("ctx, n_min, n_max, k, want", [
    ([1, 2, 3, 4, 5, 9, 1, 2, 3], 1, 4, 3, [4, 5, 9]),
    ([1, 2, 3], 1, 4, 3, []),
    ([5, 3, 8, 1, 3, 9, 2, 3], 1, 4, 2, [9, 2]),       # 1-gram: the latest earlier "3"
    ([5, 3, 8, 1, 3, 9, 2, 3], 2, 4, 2, []),           # no 2-gram recurs
    ([1, 2, 9, 1, 2, 7, 5, 2], 1, 4, 2, [7, 5]),        # "2" recurs: latest match wins
    ([4, 1, 2, 8, 6, 1, 2, 7, 3, 4, 1, 2], 1, 3, 2, [8, 6]),   # "4 1 2" beats the later "1 2"
    ([1, 2, 1, 2, 1, 2], 1, 4, 5, [1, 2, 1, 2, 1]),     # a loop of period 2 goes on around the loop
    ([7, 7, 7], 1, 4, 4, [7, 7, 7, 7]),                 # ... of period 1
    ([5, 1, 2, 3, 9, 1, 2, 3], 1, 4, 6, [9, 1, 2, 3, 9, 1]),   # the copy reaches the end after 4 tokens
    ([1, 2, 3, 4, 5, 9, 1, 2, 3], 1, 4, 8, [4, 5, 9, 1, 2, 3, 4, 5]),
])
def test_lookup_cases(ctx, n_min, n_max, k, want):
    index = NgramIndex(n_min, n_max)
    index.extend(ctx)
    assert index.lookup(k) == want == naive_lookup(ctx, n_min, n_max, k)


def test_index_matches_the_naive_reference_on_random_streams_grown_in_random_chunks():
    """Lookups after some chunks only: each n's table is caught up when a lookup first reads it (shorter n only
    when the longer suffixes do not recur), from wherever it stopped."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        n_min = int(rng.integers(1, 3))
        n_max = int(rng.integers(n_min, 6))
        vocab = int(rng.integers(2, 7))
        index, ctx = NgramIndex(n_min, n_max), []
        while len(ctx) < 160:
            # a prompt, then accepted runs, now and then a long one (both ways of indexing, from any start)
            size = int(rng.integers(1, 7)) if ctx and rng.random() < 0.8 else int(rng.integers(1, 2 * BULK))
            chunk = rng.integers(0, vocab, size=size).tolist()
            index.extend(chunk)
            ctx += chunk
            if rng.random() < 0.3:          # no lookup: the tables fall behind, and catch up at the next one
                continue
            k = int(rng.integers(1, 6))
            assert index.lookup(k) == naive_lookup(ctx, n_min, n_max, k), (ctx, n_min, n_max, k)
            assert index.match(k) == naive_match(ctx, n_min, n_max, k), (ctx, n_min, n_max, k)


def test_index_refuses_bad_orders():
    with pytest.raises(ValueError, match="ngram_min"):
        NgramIndex(0, 2)
    with pytest.raises(ValueError, match="ngram_max"):
        NgramIndex(3, 2)


def test_proposer_follows_the_growing_sequence():
    seq = Sequence(seq_id=0, request_id="r", seq_index=0, prompt_token_ids=[7, 8, 9, 1, 7, 8],
                   params=SamplingParams())
    prop = NgramProposer(1, 3)
    first = prop.propose([seq], [2])
    assert first.draft_token_ids == {0: [9, 1]} and first.evidence == {0: 2}        # "7 8" matched
    seq.output_token_ids.extend([9, 1, 7])
    again = prop.propose([seq], [3])
    assert again.draft_token_ids == {0: [8, 9, 1]} and again.evidence == {0: 3}     # "9 1 7"
    seq.output_token_ids.append(5)                                 # "5" never seen: nothing to propose
    none = prop.propose([seq], [3])
    assert none.draft_token_ids == {} and none.evidence == {}
    prop.free([0])
    assert prop._indexes == {}
