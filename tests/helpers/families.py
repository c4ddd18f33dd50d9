"""Random checkpoints of the families beside Llama, written by transformers' own config classes (``make_hf_checkpoint``),
for the tests that compose them with the engine's features; and their PEFT adapters' targets."""
from __future__ import annotations

import random
from pathlib import Path

from tests.helpers.checkpoints import make_hf_checkpoint

SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, tie_word_embeddings=False)


def longrope(rotary_dim: int, original: int) -> dict:
    """Phi-3's ``rope_scaling`` (LongRoPE) with seeded factors over ``rotary_dim`` dims."""
    rng = random.Random(rotary_dim)
    return {"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": original,
            "short_factor": [round(1 + rng.random(), 3) for _ in range(rotary_dim // 2)],
            "long_factor": [round(2 + 8 * rng.random(), 3) for _ in range(rotary_dim // 2)]}


# name: (config class, fields)
FAMILIES = {
    "qwen3": ("Qwen3Config", dict(SMALL, head_dim=16, max_position_embeddings=256)),
    # Phi-4-mini's layout: fused qkv_proj / gate_up_proj, LongRoPE on 12 of 16 dims, original context 128 of 512
    # (served: 128), tied embeddings
    "phi4_partial": ("Phi3Config", dict(SMALL, max_position_embeddings=512, original_max_position_embeddings=128,
                                        partial_rotary_factor=0.75, tie_word_embeddings=True,
                                        rope_parameters={**longrope(12, 128), "partial_rotary_factor": 0.75})),
    # Gemma 3 text: layer 0 slides over 16 tokens (its own RoPE base), layer 1 is full; (1 + w) norms, the sandwich
    # norms, GeGLU-tanh, the embedding scale, query_pre_attn_scalar, soft-capped logits, tied embeddings (as Gemma's)
    "gemma3": ("Gemma3TextConfig", dict(SMALL, head_dim=16, max_position_embeddings=256, sliding_window=16,
                                        sliding_window_pattern=2, query_pre_attn_scalar=24,
                                        final_logit_softcapping=10.0, tie_word_embeddings=True)),
}

# norm weights drawn from their own range (make_hf_checkpoint's norm_ranges): Gemma 3's norms scale by 1 + w; its
# post-attention / post-feedforward norms at 1 + w in [0.4, 0.6] keep each sublayer's output near the size of the
# embeddings it is added to (near 1 as the others', 1 + w near 2 drowns them: sampled continuations then follow no
# span of their context and n-gram drafts are never accepted; near 0.2, LoRA adapters change no greedy output)
NORM_RANGES = {"gemma3": {"post_attention_layernorm": (-0.6, -0.4), "post_feedforward_layernorm": (-0.6, -0.4)}}

# each family's PEFT target modules: the projections its checkpoint stores (split, or Phi-3's fused ones)
PEFT_TARGETS = {
    "qwen3": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
    "phi4_partial": ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"),
    "gemma3": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
}


def make_family_checkpoint(folder: Path, name: str, seed: int = 2, **overrides) -> Path:
    cls, fields = FAMILIES[name]
    return make_hf_checkpoint(folder, cls, seed=seed, norm_ranges=NORM_RANGES.get(name), **{**fields, **overrides})
