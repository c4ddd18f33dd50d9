"""The engine's per-request stats and drawn seeds (backend/engine/llm_engine.py, backend/engine/step_timeline.py)."""
from __future__ import annotations

import pytest

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine, output_token_ids
from contracts.sampling_params import SamplingParams

PROMPT = [0, 21, 22, 23, 24]


@pytest.fixture(scope="module")
def engine(tiny_checkpoint):
    eng = LLMEngine(EngineConfig.from_settings(model_path=str(tiny_checkpoint), kv_cache_bytes=8 << 20,
                                               max_model_len=256)).start()
    yield eng
    eng.shutdown()


def final(outs):
    last, = [o for o in outs if o.request_finished]
    return last


def test_unseeded_sampled_request_reports_a_seed_that_replays_it(engine):
    params = SamplingParams(max_tokens=16, temperature=1.0, top_p=0.9, ignore_eos=True)
    # four unseeded requests together, then each replayed alone with its reported seed
    runs = engine.generate([PROMPT] * 4, params)
    seeds = [final(o).stats.seed for o in runs]
    assert all(isinstance(s, int) and 0 <= s < 2**63 for s in seeds)
    assert len(set(seeds)) == 4, "each request draws its own seed"
    outputs = [output_token_ids(o) for o in runs]
    assert len({tuple(t) for t in outputs}) > 1, "identical unseeded prompts should not all coincide"
    for seed, tokens in zip(seeds, outputs):
        replay = engine.generate([PROMPT], SamplingParams(max_tokens=16, temperature=1.0, top_p=0.9, ignore_eos=True,
                                                          seed=seed))[0]
        assert output_token_ids(replay) == tokens
        assert final(replay).stats.seed == seed


def test_seeded_request_keeps_its_seed_and_greedy_draws_none(engine):
    seeded = engine.generate([PROMPT], SamplingParams(max_tokens=4, temperature=0.7, seed=42))[0]
    assert final(seeded).stats.seed == 42
    greedy = engine.generate([PROMPT], SamplingParams(max_tokens=4, temperature=0.0))[0]
    assert final(greedy).stats.seed is None


def test_stats_timeline_is_ordered_and_counts_tokens(engine):
    outs = engine.generate([PROMPT], SamplingParams(max_tokens=9, temperature=0.0, ignore_eos=True))[0]
    assert sum(o.stats is not None for o in outs) == 1, "stats ride on the final output only"
    s = final(outs).stats
    assert s.arrival_time <= s.first_scheduled_time <= s.first_token_time <= s.finished_time
    assert s.num_prompt_tokens == len(PROMPT) and s.num_output_tokens == 9
    assert len(s.inter_token_latencies) == 8 and all(x >= 0 for x in s.inter_token_latencies)
    assert s.num_decode_steps == 8 and s.num_prefill_chunks == 1
    assert s.prefill_chunks[0][2] == len(PROMPT)
    assert 0 < s.time_per_output_token < s.e2e_latency
    assert s.queue_time >= 0 and s.time_to_first_token <= s.e2e_latency
