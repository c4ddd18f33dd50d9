"""The prefix-cache key includes the adapter: the same prompt under two adapters never shares a block, under one
adapter (or none) it does."""
from __future__ import annotations

import itertools

from backend.core.block_manager import BlockManager
from backend.core.sequence import Sequence
from contracts.sampling_params import SamplingParams

PROBE_IDS = itertools.count(100)          # a fresh sequence per probe (hashes are memoised per sequence)
PROMPT = list(range(3, 3 + 4 * 8 + 1))   # four full blocks of 8 and one token more


def computed(bm: BlockManager, seq_id: int, name: str | None) -> Sequence:
    """Run a sequence's prompt into the pool and release it (its full blocks stay cached)."""
    seq = Sequence(seq_id=seq_id, request_id=f"r{seq_id}", seq_index=0, prompt_token_ids=list(PROMPT),
                   params=SamplingParams(lora_name=name))
    hit = bm.get_computed_blocks(seq)
    assert bm.allocate_slots(seq, len(PROMPT) - hit.num_cached_tokens, computed=hit) is not None
    seq.num_computed_tokens = len(PROMPT)
    bm.commit_full_blocks(seq)
    bm.free(seq)
    return seq


def hits(bm: BlockManager, name: str | None) -> int:
    probe = Sequence(seq_id=next(PROBE_IDS), request_id="probe", seq_index=0, prompt_token_ids=list(PROMPT),
                     params=SamplingParams(lora_name=name))
    return bm.get_computed_blocks(probe).num_cached_tokens


def test_adapters_never_share_blocks():
    bm = BlockManager(64, 8)
    computed(bm, 0, "a")
    assert hits(bm, "a") == 32        # the same adapter: every full block
    assert hits(bm, "b") == 0         # another adapter: none
    assert hits(bm, None) == 0        # the base model: none
    computed(bm, 1, None)
    assert hits(bm, None) == 32
    assert bm.num_cached_blocks == 8  # two copies of the prompt's blocks, one per key
