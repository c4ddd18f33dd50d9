"""Block pool: ref counts, LRU eviction, prefix-cache hash chain, fork and copy-on-write."""
from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backend.core.block_manager import BlockManager, hash_block_tokens, make_extra_key
from backend.core.sequence import Sequence
from contracts.sampling_params import SamplingParams

BS = 4
_ids = itertools.count()


def make_seq(tokens, outputs=()) -> Sequence:
    return Sequence(seq_id=next(_ids), request_id="r", seq_index=0, prompt_token_ids=list(tokens),
                    params=SamplingParams(), output_token_ids=list(outputs))


def admit(bm: BlockManager, seq: Sequence, num_new: int | None = None) -> list[int] | None:
    """Admission as the scheduler does it: prefix lookup, then allocate for the rest."""
    computed = bm.get_computed_blocks(seq)
    n = seq.num_tokens - computed.num_cached_tokens if num_new is None else num_new
    ids = bm.allocate_slots(seq, n, computed=computed)
    if ids is not None:
        seq.num_computed_tokens = computed.num_cached_tokens
    return ids


def compute(bm: BlockManager, seq: Sequence, n: int | None = None) -> None:
    """Pretend the runner computed ``n`` more tokens, then cache the blocks that became full."""
    seq.num_computed_tokens += seq.num_tokens - seq.num_computed_tokens if n is None else n
    bm.commit_full_blocks(seq)


def check_invariants(bm: BlockManager, live: list[Sequence]) -> None:
    refs = {b.block_id: 0 for b in bm.blocks}
    for s in live:
        for bid in s.block_table:
            refs[bid] += 1
    for b in bm.blocks:
        assert b.ref_count == refs[b.block_id], f"block {b.block_id}: ref {b.ref_count} != holders {refs[b.block_id]}"
        assert (b.block_id in bm._free) == (b.ref_count == 0)
        if b.block_hash is not None:
            assert bm._cached[b.block_hash] is b
    assert all(b.block_hash == h for h, b in bm._cached.items())
    assert len(bm._free) == len(set(bm._free)) == bm.num_free_blocks
    assert bm.num_free_blocks + bm.num_used_blocks == bm.num_blocks


def test_allocate_free_ref_counts_and_double_free():
    bm = BlockManager(8, BS)
    a = make_seq(range(10))
    assert admit(bm, a) == [0, 1, 2]            # 10 tokens -> 3 blocks, uncached blocks in id order
    assert bm.num_used_blocks == 3 and bm.num_free_blocks == 5
    assert [bm.blocks[i].ref_count for i in a.block_table] == [1, 1, 1]
    bm.free(a)
    assert bm.num_used_blocks == 0 and a.block_table == []
    bm.free(a)                                   # idempotent: the table is gone
    assert bm.num_free_blocks == 8
    with pytest.raises(RuntimeError, match="double free"):
        bm._release(bm.blocks[0])


def test_allocate_none_when_short_changes_nothing():
    bm = BlockManager(4, BS)
    a, b = make_seq(range(12)), make_seq(range(100, 108))
    assert admit(bm, a) is not None              # 3 blocks
    before = (bm.num_free_blocks, list(a.block_table))
    assert admit(bm, b) is None                  # needs 2, 1 free
    assert b.block_table == [] and (bm.num_free_blocks, a.block_table) == before
    a.num_computed_tokens, a.output_token_ids = 12, [5]  # position 12 needs a 4th block
    assert bm.allocate_slots(a, 1, reserve=1) is None   # would leave 0 < reserve
    assert bm.allocate_slots(a, 1) is not None
    check_invariants(bm, [a])


def test_decode_allocates_a_block_only_at_a_boundary():
    bm = BlockManager(8, BS)
    a = make_seq(range(7))
    admit(bm, a)
    compute(bm, a)
    a.output_token_ids.append(50)                # 8 tokens: position 7 fits block 1
    assert bm.allocate_slots(a, 1) == []
    compute(bm, a)
    a.output_token_ids.append(51)                # position 8 needs block 2
    assert len(bm.allocate_slots(a, 1)) == 1 and len(a.block_table) == 3


def test_hash_chain_properties():
    key = make_extra_key("model-a|tok-1")
    h1 = hash_block_tokens(None, [1, 2, 3, 4], key)
    h2 = hash_block_tokens(h1, [5, 6, 7, 8], key)
    assert h1 == hash_block_tokens(None, [1, 2, 3, 4], key) and len(h1) == 32
    assert h2 != hash_block_tokens(hash_block_tokens(None, [1, 2, 3, 5], key), [5, 6, 7, 8], key)  # parent matters
    assert h1 != hash_block_tokens(None, [1, 2, 3, 4], make_extra_key("model-a|tok-2"))
    assert h1 != hash_block_tokens(None, [4, 3, 2, 1], key)

    bm = BlockManager(16, BS, cache_key="m")
    a, b, c = make_seq(range(12)), make_seq(list(range(8)) + [99, 98, 97, 96]), make_seq([7] + list(range(1, 12)))
    ha, hb, hc = bm.block_hashes(a), bm.block_hashes(b), bm.block_hashes(c)
    assert ha[:2] == hb[:2] and ha[2] != hb[2]     # same prefix -> same hashes, then they diverge
    assert all(x != y for x, y in zip(ha, hc))     # a different first block changes every later hash
    other = BlockManager(16, BS, cache_key="other-tokenizer")
    assert all(x != y for x, y in zip(ha, other.block_hashes(make_seq(range(12)))))


def test_prefix_hit_returns_the_right_blocks_and_never_the_whole_prompt():
    bm = BlockManager(16, BS)
    a = make_seq(range(10))
    admit(bm, a)
    compute(bm, a)                               # blocks 0,1 full and cached; block 2 partial
    assert bm.num_cached_blocks == 2
    b = make_seq(list(range(8)) + [77, 78, 79])
    hit = bm.get_computed_blocks(b)
    assert [x.block_id for x in hit.blocks] == a.block_table[:2] and hit.num_cached_tokens == 8
    admit(bm, b)
    assert b.block_table[:2] == a.block_table[:2] and b.num_computed_tokens == 8
    assert bm.blocks[a.block_table[0]].ref_count == 2
    assert (bm.prefix_cache_queries, bm.prefix_cache_hits, bm.num_reused_blocks) == (10 + 11, 8, 2)   # a looked up 10 tokens, b 11
    # prompt of exactly 2 cached blocks: the last block is recomputed so the step has logits
    c = make_seq(range(8))
    assert bm.get_computed_blocks(c).num_cached_tokens == 4
    # a different cache key never hits
    other = BlockManager(16, BS, cache_key="changed-template")
    assert other.get_computed_blocks(make_seq(range(10))).num_cached_tokens == 0
    check_invariants(bm, [a, b])


def test_freed_cached_blocks_stay_hittable_then_evict_lru_and_lose_their_hash():
    bm = BlockManager(6, BS)
    a, b = make_seq(range(8)), make_seq(range(100, 108))
    for s in (a, b):
        admit(bm, s)
        compute(bm, s, 8)
    assert bm.num_cached_blocks == 4
    a_blocks, b_blocks = list(a.block_table), list(b.block_table)
    bm.free(a)
    bm.free(b)
    # eviction order: the 2 never-used blocks, then a's tail, a's head, b's tail, b's head
    assert bm.free_block_ids() == [4, 5, a_blocks[1], a_blocks[0], b_blocks[1], b_blocks[0]]
    # a hit takes a freed cached block out of the free queue (not evicted)
    a2 = make_seq(list(range(8)) + [1])
    admit(bm, a2)
    assert a2.block_table[:2] == a_blocks and bm.num_free_blocks == 3   # 2 hits + 1 new block (4)
    assert a2.block_table[2] == 4
    # allocating 3 more blocks evicts: 5 (uncached), then b's tail, then b's head (LRU among cached)
    c = make_seq(range(200, 212))
    evicted_hashes = [bm.blocks[i].block_hash for i in b_blocks]
    admit(bm, c)
    assert c.block_table == [5, b_blocks[1], b_blocks[0]]
    assert all(bm.blocks[i].block_hash is None for i in b_blocks)
    assert all(h not in bm._cached for h in evicted_hashes)
    assert bm.get_computed_blocks(make_seq(range(100, 109))).num_cached_tokens == 0
    check_invariants(bm, [a2, c])


def test_uncached_freed_blocks_are_reused_before_cached_ones():
    bm = BlockManager(4, BS)
    a = make_seq(range(8))
    admit(bm, a)
    compute(bm, a)                               # both blocks cached
    b = make_seq(range(50, 56))
    admit(bm, b)                                 # blocks 2, 3: never full
    bm.free(a)
    bm.free(b)
    assert bm.free_block_ids()[:2] == sorted(bm.free_block_ids()[:2]) and set(bm.free_block_ids()[:2]) == {2, 3}
    d = make_seq(range(300, 304))
    admit(bm, d)                                 # takes an uncached block; a's prefix survives
    assert bm.get_computed_blocks(make_seq(range(9))).num_cached_tokens == 8


def test_fork_shares_blocks_and_copy_on_write():
    bm = BlockManager(8, BS)
    parent = make_seq(range(6))                  # blocks: [0..3] full, [4,5] partial
    admit(bm, parent)
    compute(bm, parent)
    child = make_seq(range(6))
    bm.fork(parent, child)
    assert child.block_table == parent.block_table
    assert [bm.blocks[i].ref_count for i in parent.block_table] == [2, 2]
    shared_tail = parent.block_table[1]
    parent.output_token_ids.append(9)            # parent writes position 6 into the shared partial block
    new = bm.allocate_slots(parent, 1)
    assert len(new) == 1 and parent.block_table[1] == new[0] != shared_tail
    assert bm.take_blocks_to_copy() == [(shared_tail, new[0])] and bm.take_blocks_to_copy() == []
    assert bm.blocks[shared_tail].ref_count == 1 and parent.block_table[0] == child.block_table[0]
    child.num_computed_tokens = 5                # the child recomputes its last prompt token: now private
    assert bm.allocate_slots(child, 1) == [] and bm.take_blocks_to_copy() == []
    check_invariants(bm, [parent, child])
    bm.free(parent)
    assert bm.blocks[child.block_table[0]].ref_count == 1
    bm.free(child)
    assert bm.num_used_blocks == 0


def test_writing_into_a_cached_block_copies_it():
    bm = BlockManager(8, BS)
    a = make_seq(range(8))
    admit(bm, a)
    compute(bm, a)                               # 2 full cached blocks
    cached = a.block_table[1]
    a.num_computed_tokens = 7                    # e.g. a forked child recomputing its last prompt token
    new = bm.allocate_slots(a, 1)
    assert a.block_table[1] == new[0] != cached
    assert bm.take_blocks_to_copy() == [(cached, new[0])]
    assert bm.blocks[cached].ref_count == 0 and bm.blocks[cached].block_hash is not None   # still hittable
    check_invariants(bm, [a])


def test_truncate_frees_blocks_beyond():
    bm = BlockManager(8, BS)
    a = make_seq(range(5))
    admit(bm, a, 5 + 6)                          # prompt + 6 draft positions -> 3 blocks
    assert len(a.block_table) == 3
    bm.truncate(a, 6)
    assert len(a.block_table) == 2 and bm.num_used_blocks == 2
    bm.truncate(a, 0)
    assert a.block_table == [] and bm.num_used_blocks == 0


def test_disabled_prefix_caching_and_reset():
    off = BlockManager(8, BS, enable_prefix_caching=False)
    a = make_seq(range(8))
    admit(off, a)
    compute(off, a)
    assert off.num_cached_blocks == 0 and off.get_computed_blocks(make_seq(range(9))).num_cached_tokens == 0

    bm = BlockManager(8, BS)
    b = make_seq(range(8))
    admit(bm, b)
    compute(bm, b)
    assert not bm.reset_prefix_cache()          # blocks in use
    bm.free(b)
    assert bm.reset_prefix_cache() and bm.num_cached_blocks == 0
    assert bm.get_computed_blocks(make_seq(range(9))).num_cached_tokens == 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["admit", "step", "free", "fork", "truncate"]),
                          st.integers(0, 10**6)), min_size=1, max_size=60),
       st.integers(3, 12), st.booleans())
def test_random_operations_keep_the_pool_consistent(ops, num_blocks, caching):
    bm = BlockManager(num_blocks, BS, enable_prefix_caching=caching)
    live: list[Sequence] = []
    prefixes = [list(range(10)), list(range(20, 26))]
    for op, r in ops:
        if op == "admit" or not live:
            s = make_seq(prefixes[r % 2][: 1 + r % 9] + [r % 7] * (r % 4))
            if admit(bm, s) is not None:
                live.append(s)
            continue
        s = live[r % len(live)]
        if op == "step":                            # compute every uncomputed token, then sample one
            if bm.allocate_slots(s, s.num_tokens - s.num_computed_tokens) is not None:
                compute(bm, s)
                s.output_token_ids.append(r % 5)
        elif op == "free":
            bm.free(s)
            live.remove(s)
        elif op == "fork" and s.num_computed_tokens >= 1:
            c = make_seq(s.all_token_ids[: s.num_computed_tokens])
            bm.fork(s, c)
            c.num_computed_tokens = c.num_tokens - 1
            live.append(c)
        elif op == "truncate":                      # speculative rollback of up to 2 computed positions
            keep = max(0, s.num_computed_tokens - r % 3)
            bm.truncate(s, keep)
            s.num_computed_tokens = keep
        bm.take_blocks_to_copy()
        check_invariants(bm, live)
        for s in live:                              # every live sequence's table covers what it computed
            assert len(s.block_table) * BS >= s.num_computed_tokens
    for s in live:
        bm.free(s)
    assert bm.num_used_blocks == 0 and bm.num_free_blocks == num_blocks
