"""Persistent decode inputs (backend/engine/decode_batch.py): rows follow their sequences through
admission, growth across blocks, speculative rollback, preemption, abort and finish; and the native
step, which runs every step on the CPU (prefill chunks too), gives the eager engine's tokens."""
from __future__ import annotations

import numpy as np
import pytest

from backend.config import EngineConfig
from backend.engine.decode_batch import PersistentDecodeBatch, decode_step_shape
from backend.engine.llm_engine import LLMEngine, output_token_ids
from contracts.sampling_params import SamplingParams
from tests.helpers.oracle import repeating_prompts


@pytest.fixture(scope="module", autouse=True)
def native(native_lib):
    """Every test here runs the native step."""


def checked_engine(config: EngineConfig, log: dict) -> LLMEngine:
    """An engine whose runner checks the persistent rows after every step it runs."""
    engine = LLMEngine(config)
    runner = engine.runner
    batch = runner.fast_decode.batch
    execute = runner.execute

    def checked(plan):
        fast = runner.fast_decode.accepts(plan)
        out = execute(plan)
        decode = decode_step_shape(plan)
        log["decode_steps"] += fast and decode
        log["prefill_steps"] += fast and not decode
        log["eager_steps"] += not fast
        log["max_rows"] = max(log["max_rows"], batch.num_rows_in_use)
        gone = set(plan.finished_seq_ids) | {s.seq_id for s in plan.preempted}
        rows = {}
        for s in plan.scheduled:
            row = batch.row_of(s.seq.seq_id)
            if fast:
                assert row is not None
                table = s.seq.block_table
                assert np.array_equal(batch.block_tables.numpy()[row, :len(table)], table), "stale block table row"
                assert row not in rows.values(), "two sequences share a row"
                rows[s.seq.seq_id] = row
        assert not any(batch.row_of(i) is not None for i in gone), "a finished or preempted sequence kept its row"
        return out

    runner.execute = checked
    return engine


@pytest.mark.parametrize("spec", ["none", "ngram"])
def test_rows_follow_sequences_and_tokens_match_eager(tiny_checkpoint, spec):
    prompts = repeating_prompts(3, 12, stem_len=20, span_range=(4, 12), gap_range=(2, 20))
    params = [SamplingParams(max_tokens=10 + 7 * (i % 4), temperature=0.0, ignore_eos=True) for i in range(12)]
    # a pool small enough to preempt, blocks of 4 so that every few tokens cross a block boundary
    kw = {"model_path": str(tiny_checkpoint), "block_size": 4, "num_kv_blocks": 48, "max_num_seqs": 8,
          "watermark": 0.0, "max_model_len": 128, "speculative_method": spec, "num_speculative_tokens": 3}
    eager = LLMEngine(EngineConfig.from_settings(**kw))
    expected = [output_token_ids(o) for o in eager.generate(prompts, params)]
    log = {"decode_steps": 0, "prefill_steps": 0, "eager_steps": 0, "max_rows": 0}
    engine = checked_engine(EngineConfig.from_settings(**kw, fast_decode=True), log)
    got = [output_token_ids(o) for o in engine.generate(prompts, params)]
    assert got == expected
    assert log["decode_steps"] > 10 and log["prefill_steps"] > 0 and log["eager_steps"] == 0
    assert engine.stats().num_preemptions > 0, "the pool was meant to force preemption"
    if spec == "ngram":
        assert engine.stats().spec.num_accepted_tokens > 0, "verify steps were meant to accept drafts"
    # the last sequences to finish are released by the next plan (which lists them as finished), none other
    held = set(engine.runner.fast_decode.batch.seq_ids())
    assert held <= set(engine.scheduler._finished_seq_ids), "rows leaked"
    assert engine.stats().kv_blocks_used == 0


def test_aborted_sequences_release_their_rows(tiny_checkpoint):
    log = {"decode_steps": 0, "prefill_steps": 0, "eager_steps": 0, "max_rows": 0}
    engine = checked_engine(EngineConfig.from_settings(model_path=str(tiny_checkpoint), block_size=4,
                                                       fast_decode=True), log)
    params = SamplingParams(max_tokens=50, temperature=0.0, ignore_eos=True)
    for i in range(4):
        engine.add_request(f"r{i}", [0, 5 + i, 9, 11], params, lambda out: None)
    for _ in range(6):
        engine.step()
    batch = engine.runner.fast_decode.batch
    assert batch.num_rows_in_use == 4
    engine.abort("r1")
    engine.abort("r2")
    engine.step()   # the abort frees the sequences; the next plan lists them as finished
    engine.step()
    assert batch.num_rows_in_use == 2
    while engine.has_work():
        engine.step()
    assert set(batch.seq_ids()) <= set(engine.scheduler._finished_seq_ids)
    engine.add_request("next", [0, 5], params, lambda out: None)
    engine.step()   # its prefill plan lists the finished sequences: their rows go; its prefill takes a row
    assert batch.seq_ids() == [engine.scheduler.running[0].seq_id]
    engine.step()   # its first decode keeps the row
    assert batch.num_rows_in_use == 1


class _Seq:
    def __init__(self, seq_id, table, computed):
        self.seq_id, self.block_table, self.num_computed_tokens = seq_id, table, computed


def test_sync_rewrites_only_the_mutable_tail():
    batch = PersistentDecodeBatch(block_size=4, rows=1, width=2)
    seq = _Seq(7, [3, 8], computed=5)
    row = batch._sync_row(seq)
    assert batch.block_tables[row, :2].tolist() == [3, 8]
    batch.block_tables[row, 0] = 99                    # an entry before the computed block: never rewritten
    seq.block_table = [3, 6, 4, 5]   # copy-on-write of block 1 (position 5 is written next), then growth
    batch._sync_row(seq)
    assert batch.block_tables[row, :4].tolist() == [99, 6, 4, 5]
    other = batch._sync_row(_Seq(8, [1], computed=0))    # a second row: the table grows
    assert other != row and batch.block_tables[other, 0] == 1 and batch.block_tables[row, 1] == 6
    seq.block_table, seq.num_computed_tokens = [3, 6], 7     # drafts rejected: blocks 2 and 3 released
    batch._sync_row(seq)
    assert batch.block_tables[row, :2].tolist() == [99, 6]
    batch.release([7])
    assert batch.row_of(7) is None and batch.row_of(8) == other
