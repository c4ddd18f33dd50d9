"""LoRA oracle for the families beside Llama: random PEFT adapters (written by ``peft`` on each family's own target
modules: Qwen3's and Gemma 3's split q/k/v/o/gate/up/down, Phi-3's fused ``qkv_proj`` / ``gate_up_proj``) on random
Qwen3, Phi-4-mini-layout and Gemma 3 checkpoints; the engine's greedy output under each adapter, and under none, in one
mixed batch, equals transformers with PEFT applying the same adapter, token for token: eagerly, and on the native step
with n-gram speculation under preemption. A Phi-3 adapter naming split modules is refused naming them."""
from __future__ import annotations

import json

import pytest

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.lora.adapter import load_adapter
from backend.lora.adapter_config import LoraConfigError
from backend.model.config import ModelConfig
from tests.backend.engine.test_lora_oracle import NEW_TOKENS, prompts_for, run_mixed
from tests.helpers.families import FAMILIES, PEFT_TARGETS, make_family_checkpoint
from tests.helpers.lora import peft_greedy
from tests.helpers.oracle import assert_same_tokens


def adapters_for(family: str) -> dict[str, dict]:
    """Two adapters: every projection (rank 8), and the attention's first projection with the MLP's down (rank 4,
    a rank_pattern on down_proj and an alpha_pattern on the qkv one)."""
    targets = PEFT_TARGETS[family]
    return {"all8": dict(rank=8, alpha=16, targets=targets, scale=0.1, seed=11),
            "attn4": dict(rank=4, alpha=8, targets=(targets[0], "down_proj"), scale=0.12, seed=12, rslora=True,
                          rank_pattern={"down_proj": 2}, alpha_pattern={targets[0]: 16})}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def oracle(request, tmp_path_factory):
    from tools.make_lora_adapter import make_adapter

    family, root = request.param, tmp_path_factory.mktemp(request.param)
    base = make_family_checkpoint(root / "ckpt", family)
    folders = {name: make_adapter(base, root / name, **opts) for name, opts in adapters_for(family).items()}
    prompts = prompts_for(5, 6)
    expected = {name: peft_greedy(base, folder, prompts, NEW_TOKENS) for name, folder in folders.items()}
    expected[None] = peft_greedy(base, None, prompts, NEW_TOKENS)
    return family, base, folders, prompts, expected


def test_adapters_target_the_family_modules_and_change_the_output(oracle):
    family, base, folders, prompts, expected = oracle
    cfg = ModelConfig.from_file(base / "config.json")
    for name, folder in folders.items():
        adapter = load_adapter(folder, name, cfg)
        assert {m for _, m in adapter.parts} == set(json.loads((folder / "adapter_config.json").read_text())
                                                    ["target_modules"]) <= set(PEFT_TARGETS[family])
        changed = sum(a != b for a, b in zip(expected[name], expected[None]))
        assert changed >= len(prompts) / 2, f"{family}: adapter {name} changes only {changed} of {len(prompts)}"


VARIANTS = {
    "eager": dict(fast_decode=False),
    "native_ngram_preemption": dict(fast_decode=True, speculative_method="ngram", num_speculative_tokens=3,
                                    num_kv_blocks=14, block_size=16, watermark=0.0, max_model_len=128),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_mixed_batch_matches_peft(oracle, variant):
    family, base, folders, prompts, expected = oracle
    engine = LLMEngine(EngineConfig.from_settings(model_path=str(base), device="cpu", max_num_seqs=32,
                                                  lora_adapters=tuple((n, str(f)) for n, f in folders.items()),
                                                  **VARIANTS[variant]))
    try:
        assert (engine.runner.fast_decode is not None) == variant.startswith("native")
        got = run_mixed(engine, prompts, [None, *folders])
        for (name, i), tokens in got.items():
            assert_same_tokens(tokens, expected[name][i], f"{family}/{variant}: adapter {name}, prompt {i}: ")
        if "preemption" in variant:
            assert engine.stats().num_preemptions > 0, "the small KV pool never preempted"
        assert engine.scheduler.block_manager.num_free_blocks == engine.scheduler.block_manager.num_blocks
    finally:
        engine.shutdown()


def test_split_targets_on_a_fused_family_are_refused_by_name(tmp_path):
    from tools.make_lora_adapter import make_adapter

    base = make_family_checkpoint(tmp_path / "ckpt", "phi4_partial")     # Phi-3's layout: q/k/v and gate/up fused
    fused = make_adapter(base, tmp_path / "fused", **adapters_for("phi4_partial")["all8"])
    folder = tmp_path / "split"
    folder.mkdir()
    config = json.loads((fused / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps(dict(config, target_modules=["q_proj", "v_proj"])))
    (folder / "adapter_model.safetensors").write_bytes((fused / "adapter_model.safetensors").read_bytes())
    with pytest.raises(LoraConfigError, match=r"target_modules \['q_proj', 'v_proj'\] are not projections of the "
                                              r"Phi3ForCausalLM base \(its PEFT targets: qkv_proj, o_proj"):
        load_adapter(folder, "split", ModelConfig.from_file(base / "config.json"))
