"""Our RoPE variants against HF transformers' reference implementations."""
import pytest
import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from backend.model.config import CheckpointError, ModelConfig
from backend.model.rope import apply_rope, rope_parameters

BASE = {"architectures": ["LlamaForCausalLM"], "vocab_size": 128, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 512, "rope_theta": 10000.0}

CASES = [
    {"rope_type": "linear", "factor": 4.0},
    {"rope_type": "dynamic", "factor": 2.0},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 128},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128, "beta_fast": 16.0,
     "beta_slow": 2.0, "mscale": 1.0, "mscale_all_dim": 0.5},
]


@pytest.mark.parametrize("scaling", CASES, ids=lambda c: c["rope_type"])
def test_inv_freq_matches_hf(scaling):
    ours, our_scale = rope_parameters(ModelConfig.from_dict({**BASE, "rope_scaling": scaling}))
    hf_cfg = LlamaConfig(**{k: v for k, v in BASE.items() if k != "architectures"}, rope_scaling=dict(scaling))
    seq_len = None
    if scaling["rope_type"] == "dynamic":  # we fix the dynamic length at the scaled maximum (as vLLM)
        seq_len = int(BASE["max_position_embeddings"] * scaling["factor"])
    hf, hf_scale = ROPE_INIT_FUNCTIONS[scaling["rope_type"]](hf_cfg, "cpu", seq_len=seq_len)
    torch.testing.assert_close(ours, hf.float(), rtol=1e-5, atol=1e-7)
    assert our_scale == pytest.approx(hf_scale)


def test_default_rope_and_transformers5_rope_parameters():
    a, _ = rope_parameters(ModelConfig.from_dict(BASE))
    cfg = {k: v for k, v in BASE.items() if k != "rope_theta"}
    b, _ = rope_parameters(ModelConfig.from_dict({**cfg, "rope_parameters": {"rope_type": "default",
                                                                              "rope_theta": 10000.0}}))
    torch.testing.assert_close(a, b)


def test_unknown_rope_type_is_rejected():
    with pytest.raises(CheckpointError, match="unknown rope type 'su'"):
        ModelConfig.from_dict({**BASE, "rope_scaling": {"type": "su", "factor": 2.0}})


def test_apply_rope_preserves_norm():
    x = torch.randn(5, 4, 16)
    inv, _ = rope_parameters(ModelConfig.from_dict({**BASE, "hidden_size": 64}))
    t = torch.arange(5).float()[:, None] * inv[None]
    emb = torch.cat([t, t], -1)
    y = apply_rope(x, emb.cos()[:, None], emb.sin()[:, None])
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))
    assert not torch.allclose(y[1:], x[1:])
