"""Oracle: each declared family's random checkpoint, written by transformers' own config class, loads into our
model with logits equal to transformers' (the same fp32 maths in another order: 1e-4 absolute) and the same greedy
continuation. The variants cover each block the declarations name: q/k norms and q/k/v/o biases (Qwen3), o_proj
biases (Llama's attention_bias), fused qkv_proj / gate_up_proj in the checkpoint, LongRoPE and partial rotary
(Phi-3, Phi-4-mini)."""
from __future__ import annotations


import pytest
import torch
from transformers import AutoModelForCausalLM

from backend.model.loader import load_model
from tests.helpers.checkpoints import make_hf_checkpoint
from tests.helpers.families import SMALL, longrope
from tests.helpers.oracle import assert_greedy_matches_hf, assert_logits_match_hf, random_prompts

# name: (config class, fields)
FAMILIES = {
    "qwen3": ("Qwen3Config", dict(SMALL, head_dim=16, max_position_embeddings=256)),
    "qwen3_bias_tied": ("Qwen3Config", dict(SMALL, head_dim=24, attention_bias=True, tie_word_embeddings=True,
                                            max_position_embeddings=256)),
    "llama_attention_bias": ("LlamaConfig", dict(SMALL, attention_bias=True, max_position_embeddings=256)),
    "phi3": ("Phi3Config", dict(SMALL, max_position_embeddings=256)),
    # Phi-3 128k's layout: LongRoPE (max 512 over an original 128: an attention factor), served within 128
    "phi3_longrope": ("Phi3Config", dict(SMALL, max_position_embeddings=512, original_max_position_embeddings=128,
                                         rope_parameters=longrope(16, 128))),
    # Phi-4-mini's: LongRoPE on 3/4 of each head, tied embeddings
    "phi4_partial": ("Phi3Config", dict(SMALL, max_position_embeddings=512, original_max_position_embeddings=128,
                                        partial_rotary_factor=0.75, tie_word_embeddings=True,
                                        rope_parameters={**longrope(12, 128), "partial_rotary_factor": 0.75})),
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory):
    cls, fields = FAMILIES[request.param]
    folder = make_hf_checkpoint(tmp_path_factory.mktemp(request.param) / "ckpt", cls, seed=1, **fields)
    hf = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    return request.param, folder, hf


def prompts(n: int = 4, seed: int = 0) -> list[list[int]]:
    return random_prompts(n, seed, min_len=5)


def test_logits_match_transformers(family):
    name, folder, hf = family
    ours = load_model(folder)
    assert ours.config.family == name.split("_")[0].replace("phi4", "phi3")
    assert_logits_match_hf(ours, hf, prompts())


def test_greedy_matches_transformers_generate(family):
    _, folder, hf = family
    ours = load_model(folder)
    assert_greedy_matches_hf(ours, hf, prompts(3, seed=1))
