"""LoRA oracle: greedy output under each of three adapters (and none) in one mixed batch equals HF transformers
with PEFT applying the same adapter, token for token: eagerly, and through the native fast step under preemption,
with n-gram speculation and with a draft model; each adapter changes the greedy output of at least half the
prompts. With fewer slots than adapters (``max_loras=2``, four adapters in flight) every request completes, and
every KV block is free again afterwards."""
from __future__ import annotations

import random

import pytest

from backend.config import EngineConfig
from backend.core.outputs import FinishReason
from backend.engine.llm_engine import LLMEngine, output_token_ids
from contracts.sampling_params import SamplingParams
from tests.helpers.lora import ADAPTERS, peft_greedy, write_adapters
from tests.helpers.checkpoints import DEMO_DRAFT
from tests.helpers.oracle import assert_same_tokens

PER_ADAPTER = 8
NEW_TOKENS = 12


def prompts_for(seed: int, n: int) -> list[list[int]]:
    """Random-id prompts (BOS first), two in three repeating a span (n-gram drafts find it)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        span = [rng.randrange(7, 4000) for _ in range(rng.randint(4, 12))]
        gap = [rng.randrange(7, 4000) for _ in range(rng.randint(2, 20))]
        out.append([0] + span + gap + (span if i % 3 else []))
    return out


@pytest.fixture(scope="module")
def oracle(demo_target, tmp_path_factory):
    folders = write_adapters(demo_target, tmp_path_factory.mktemp("lora"))
    prompts = prompts_for(7, PER_ADAPTER)
    expected = {name: peft_greedy(demo_target, folders[name], prompts, NEW_TOKENS) for name in folders}
    expected[None] = peft_greedy(demo_target, None, prompts, NEW_TOKENS)
    return demo_target, folders, prompts, expected


def test_each_adapter_changes_the_output(oracle):
    _, _, prompts, expected = oracle
    for name in ADAPTERS:
        changed = sum(a != b for a, b in zip(expected[name], expected[None]))
        assert changed >= len(prompts) / 2, f"adapter {name} changes only {changed} of {len(prompts)} outputs"


def engine_for(folders, base, **kw) -> LLMEngine:
    return LLMEngine(EngineConfig.from_settings(model_path=str(base), lora_adapters=tuple((n, str(f)) for n,
                                                                                          f in folders.items()),
                                                **kw))


def run_mixed(engine: LLMEngine, prompts, names) -> dict:
    """Every prompt under every name, all submitted at once (one mixed batch); outputs by (name, prompt index)."""
    jobs = [(name, i) for i in range(len(prompts)) for name in names]
    params = [SamplingParams(max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS, temperature=0.0, lora_name=name)
              for name, _ in jobs]
    outs = engine.generate([prompts[i] for _, i in jobs], params)
    for o in outs:
        assert o[-1].request_finished and o[-1].finish_reason is FinishReason.LENGTH
    return {job: output_token_ids(o) for job, o in zip(jobs, outs)}


VARIANTS = {   # the last two on the native fast step (prefill chunks, decodes and verify steps through the op)
    "eager": dict(),
    "fast_preemption": dict(num_kv_blocks=24, max_model_len=128, fast_decode=True),
    "fast_ngram": dict(speculative_method="ngram", num_speculative_tokens=3, fast_decode=True),
    "fast_draft": dict(speculative_method="draft", draft_model_path=str(DEMO_DRAFT), num_speculative_tokens=3,
                       fast_decode=True),   # the draft proposes without adapters, the target verifies under them
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_mixed_batch_matches_peft(oracle, variant):
    base, folders, prompts, expected = oracle
    engine = engine_for(folders, base, max_num_seqs=32, max_num_batched_tokens=256, **VARIANTS[variant])
    try:
        if variant.startswith("fast"):
            assert engine.runner.fast_decode is not None, "the native step did not build"
        got = run_mixed(engine, prompts, [None, *ADAPTERS])
        for (name, i), tokens in got.items():
            assert_same_tokens(tokens, expected[name][i], f"{variant}: adapter {name}, prompt {i}: ")
        if variant == "fast_preemption":
            assert engine.stats().num_preemptions > 0, "the small KV pool never preempted"
        assert engine.scheduler.block_manager.num_free_blocks == engine.scheduler.block_manager.num_blocks
    finally:
        engine.shutdown()


def test_fewer_slots_than_adapters_completes_everything(oracle, tmp_path):
    """max_loras=2 with four adapters in flight: requests wait for a slot, none fails, each output is right."""
    base, folders, prompts, expected = oracle
    folders = dict(folders, qv8_again=folders["qv8"])
    engine = engine_for(folders, base, max_loras=2, max_cpu_loras=2, max_num_seqs=32, fast_decode=True)
    try:
        got = run_mixed(engine, prompts[:4], ["qv8", "all4", "mlp16", "qv8_again"])
        for (name, i), tokens in got.items():
            assert_same_tokens(tokens, expected["qv8" if name == "qv8_again" else name][i], f"{name}, prompt {i}: ")
        assert engine.lora.slots.installs > 2          # adapters came and went through the two slots
        assert len(engine.lora.registry.loaded_names()) <= 2
    finally:
        engine.shutdown()
