"""Oracle for Gemma 3 text (Gemma3ForCausalLM): random checkpoints written by transformers' own Gemma3TextConfig load
into our model with logits equal to transformers' (1e-4 absolute, fp32) and the same greedy continuation, on prompts
longer than the sliding window. The variants cover each block Gemma 3 declares: ``1 + w`` RMSNorms (four a layer, the
attention's and the MLP's outputs normed before their residual adds), ``1 + w`` q/k norms, GeGLU-tanh, the embedding
times sqrt(hidden_size), query_pre_attn_scalar, sliding layers from sliding_window_pattern or layer_types with their
own RoPE base (rope_local_base_freq), linear RoPE scaling on the full layers, final logit soft-capping, attention
biases, tied and untied heads. Fields we do not implement are refused by name."""
from __future__ import annotations


import pytest
import torch
from transformers import AutoModelForCausalLM

from backend.model.config import CheckpointError, ModelConfig
from backend.model.loader import load_model
from tests.helpers.checkpoints import make_hf_checkpoint
from tests.helpers.oracle import assert_greedy_matches_hf, assert_logits_match_hf, dense_logits, random_prompts

WINDOW = 8
GEMMA_SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=16, max_position_embeddings=256, sliding_window=WINDOW,
                   query_pre_attn_scalar=24)
# name: Gemma3TextConfig fields
VARIANTS = {
    # layers 0 and 2 slide (pattern 2), tied embeddings, rope_theta 1e6 / local 1e4 (the config class's defaults)
    "gemma3": dict(GEMMA_SMALL, sliding_window_pattern=2),
    # explicit layer_types, linear RoPE on the full layers and a local base of its own, soft-capped logits,
    # q/k/v/o biases, an untied head
    "gemma3_softcap_linear": dict(GEMMA_SMALL, layer_types=["full_attention", "sliding_attention", "sliding_attention"],
                                  rope_parameters={"full_attention": {"rope_type": "linear", "factor": 4.0,
                                                                      "rope_theta": 50000.0},
                                                   "sliding_attention": {"rope_type": "default", "rope_theta": 500.0}},
                                  final_logit_softcapping=3.0, attention_bias=True, tie_word_embeddings=False),
}


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def gemma(request, tmp_path_factory):
    folder = make_hf_checkpoint(tmp_path_factory.mktemp(request.param) / "ckpt", "Gemma3TextConfig", seed=1,
                                **VARIANTS[request.param])
    hf = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    return request.param, folder, hf


def prompts(n: int = 4, seed: int = 0) -> list[list[int]]:
    return random_prompts(n, seed, min_len=12)


def test_logits_match_transformers(gemma):
    name, folder, hf = gemma
    assert type(hf).__name__ == "Gemma3ForCausalLM"
    ours = load_model(folder)
    cfg = ours.config
    assert cfg.family == "gemma3" and cfg.sliding_windows and cfg.local_rope_theta is not None
    if name == "gemma3_softcap_linear":
        assert cfg.final_logit_softcapping == 3.0 and cfg.rope_type == "linear" and cfg.o_proj_bias
    assert_logits_match_hf(ours, hf, prompts())


def test_greedy_matches_transformers_generate(gemma):
    _, folder, hf = gemma
    ours = load_model(folder)
    assert_greedy_matches_hf(ours, hf, prompts(3, seed=1))


def test_each_block_matters(gemma):
    """Dropping the window, the local RoPE or the query scale changes the logits: each is exercised."""
    import dataclasses

    _, folder, _ = gemma
    ours = load_model(folder)
    ids = prompts(1, seed=2)[0]
    want = dense_logits(ours, ids)
    cfg = ours.config
    for change in ({"sliding_windows": ()}, {"query_scale": None}):
        ours.config = dataclasses.replace(cfg, **change)
        assert not torch.allclose(dense_logits(ours, ids), want, atol=1e-3), change
    ours.config = cfg
    ours._ropes = ours._ropes[:1] * 2                    # the sliding layers on the full layers' RoPE
    ours._tables = None
    assert not torch.allclose(dense_logits(ours, ids), want, atol=1e-3)


def gemma_dict(**fields) -> dict:
    return {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "vocab_size": 300,
            **GEMMA_SMALL, **fields}


def test_config_defaults_as_the_config_class():
    """Absent keys take Gemma3TextConfig's defaults: layer_types every 6th layer full, window 4096, theta 1e6 and a
    local base of 1e4, query_pre_attn_scalar 256, head_dim 256, tied embeddings."""
    d = gemma_dict(num_hidden_layers=7)
    for key in ("sliding_window", "query_pre_attn_scalar", "head_dim"):
        d.pop(key)
    cfg = ModelConfig.from_dict(d)
    assert cfg.sliding_windows == (4096,) * 5 + (None, 4096)
    assert (cfg.rope_theta, cfg.local_rope_theta) == (1e6, 1e4)
    assert cfg.query_scale == 256 ** -0.5 and cfg.head_dim == 256 and cfg.tie_word_embeddings
    assert cfg.activation == "gelu_tanh" and cfg.embed_scale == 8.0
    old = ModelConfig.from_dict(gemma_dict(rope_theta=5e5, rope_local_base_freq=77.0,
                                           rope_scaling={"rope_type": "linear", "factor": 8.0}))
    assert (old.rope_theta, old.local_rope_theta, old.rope_type, old.local_rope_scaling) == (5e5, 77.0, "linear", None)


@pytest.mark.parametrize("fields, match", [
    ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping 50.0 is not supported.*does not apply it"),
    ({"use_bidirectional_attention": True}, "use_bidirectional_attention"),
    ({"hidden_activation": "silu"}, "hidden_activation 'silu' is not supported"),
    ({"final_logit_softcapping": -1.0}, "final_logit_softcapping"),
    ({"query_pre_attn_scalar": 0}, "query_pre_attn_scalar"),
    ({"sliding_window": None}, "sliding_window"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}, "rope_parameters .* keyed by layer type"),
    ({"rope_parameters": {"full_attention": {"rope_type": "longrope", "rope_theta": 1e4}}}, "unknown rope type"),
])
def test_unimplemented_fields_are_refused_by_name(fields, match):
    with pytest.raises(CheckpointError, match=match):
        ModelConfig.from_dict(gemma_dict(**fields))
