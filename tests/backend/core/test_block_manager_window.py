"""Blocks outside every layer's sliding window: freed (NULL_BLOCK in the table), still hittable when
cached, and skipped by free / truncate / fork / commit; the scheduler frees them after each update."""
from __future__ import annotations

import random

import pytest

from backend.config import EngineConfig
from backend.core.block_manager import NULL_BLOCK, BlockManager
from backend.core.plan import ModelRunnerOutput
from backend.core.scheduler import Scheduler
from contracts.sampling_params import SamplingParams
from tests.backend.core.test_block_manager import BS, admit, compute, make_seq


def check_pool(bm: BlockManager, live) -> None:
    refs = {b.block_id: 0 for b in bm.blocks}
    for s in live:
        for bid in s.block_table:
            if bid != NULL_BLOCK:
                refs[bid] += 1
    for b in bm.blocks:
        assert b.ref_count == refs[b.block_id]
        assert (b.block_id in bm._free) == (b.ref_count == 0)
    assert bm.num_free_blocks + bm.num_used_blocks == bm.num_blocks


def test_frees_exactly_the_blocks_before_the_window():
    bm = BlockManager(16, BS)
    s = make_seq(range(30))
    admit(bm, s)
    compute(bm, s)                                 # 30 computed: the next query (position 30) sees 30-W+1 ..
    # window 10: first key needed is 21 -> blocks 0..4 (positions 0..19) are wholly before it
    assert bm.free_outside_window(s, 10) == 5
    assert s.block_table[:5] == [NULL_BLOCK] * 5 and NULL_BLOCK not in s.block_table[5:]
    check_pool(bm, [s])
    assert bm.free_outside_window(s, 10) == 0      # idempotent
    # window 11: first needed 20 = start of block 5, still nothing more
    assert bm.free_outside_window(s, 11) == 0
    s.output_token_ids.extend([1, 2])              # two decodes later: first needed 22, block 5 still live
    compute(bm, s)
    assert bm.free_outside_window(s, 10) == 0
    s.output_token_ids.extend([3, 4])
    bm.allocate_slots(s, 2)
    compute(bm, s)                                 # 34 computed: first needed 25 -> block 5 (20..23) freed
    assert bm.free_outside_window(s, 10) == 1
    check_pool(bm, [s])
    bm.free(s)                                     # NULL entries are skipped, nothing double-freed
    assert bm.num_free_blocks == 16
    check_pool(bm, [])


def test_window_never_frees_a_block_a_query_still_sees():
    """Property: after freeing, every position p >= num_computed - W + 1 has a real block."""
    rng = random.Random(0)
    for _ in range(200):
        bm = BlockManager(64, BS)
        n = rng.randint(1, 150)
        window = rng.randint(1, 40)
        s = make_seq(range(n))
        admit(bm, s)
        compute(bm, s, rng.randint(0, n))
        bm.free_outside_window(s, window)
        first_needed = max(0, s.num_computed_tokens - window + 1)
        for p in range(first_needed, n):
            assert s.block_table[p // BS] != NULL_BLOCK
        for i, bid in enumerate(s.block_table):    # and everything freed really was before the window
            if bid == NULL_BLOCK:
                assert (i + 1) * BS <= first_needed
        check_pool(bm, [s])


def test_freed_cached_blocks_are_hit_by_a_later_request():
    bm = BlockManager(16, BS)
    a = make_seq(range(24))
    admit(bm, a)
    compute(bm, a)
    assert bm.free_outside_window(a, 5) == 5       # first needed 20: blocks 0..4 freed, but cached: hittable
    b = make_seq(range(24))
    hits = bm.get_computed_blocks(b)
    assert hits.num_cached_tokens == 20            # all but the last block (which must be computed)
    admit(bm, b)
    check_pool(bm, [a, b])


def test_fork_truncate_and_commit_skip_null_entries():
    bm = BlockManager(16, BS)
    parent = make_seq(range(21))
    admit(bm, parent)
    compute(bm, parent)
    bm.free_outside_window(parent, 6)              # first needed 16: blocks 0..3 freed
    child = make_seq(range(21))
    bm.fork(parent, child)
    assert child.block_table[:4] == [NULL_BLOCK] * 4
    check_pool(bm, [parent, child])
    bm.truncate(parent, 17)
    bm.commit_full_blocks(parent)
    check_pool(bm, [parent, child])
    bm.free(child)
    bm.free(parent)
    assert bm.num_free_blocks == 16


@pytest.mark.parametrize("window,expect_peak", [(None, 19), (32, 3)])
def test_scheduler_frees_blocks_behind_the_window(window, expect_peak):
    """A 200-token prompt in chunks of 16, then 100 decodes: with a 32-token window a step's queries need
    the 31 keys before the chunk plus the chunk's 16, so at most 3 blocks are held when a plan is made
    (2 after the update frees the oldest); without a window the sequence grows to cdiv(300, 16) = 19."""
    cfg = EngineConfig.from_settings(model_path="m", block_size=16, max_num_batched_tokens=16,
                                     enable_prefix_caching=False)
    sched = Scheduler(cfg, num_blocks=40, max_model_len=512, vocab_size=300, eos_token_ids=[299],
                      sliding_window=window)
    sched.add_request("r", list(range(200)), SamplingParams(max_tokens=100, ignore_eos=True))
    peak = 0
    for _ in range(400):
        plan = sched.schedule()
        if not plan.scheduled:
            break
        peak = max(peak, sched.block_manager.num_used_blocks)
        sampled = [[7] if s.sample else [] for s in plan.scheduled]
        sched.update_from_output(plan, ModelRunnerOutput(sampled, [None] * len(sampled)))
    assert not sched.has_unfinished()
    assert peak == expect_peak
    assert sched.block_manager.num_free_blocks == 40
