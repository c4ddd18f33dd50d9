"""config.json fields that change the maths: sliding windows read exactly as transformers reads them,
and fields we do not implement refused at load with the field named."""
import pytest

from backend.model.config import CheckpointError, ModelConfig

BASE = {"vocab_size": 100, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_act": "silu"}


def cfg(arch, **extra):
    return ModelConfig.from_dict({**BASE, "architectures": [arch], **extra})


def test_mistral_windows():
    assert cfg("MistralForCausalLM", sliding_window=64).sliding_windows == (64,) * 4
    assert cfg("MistralForCausalLM", sliding_window=None).sliding_windows == ()
    assert cfg("MistralForCausalLM").sliding_windows == (4096,) * 4      # MistralConfig's default when absent
    with pytest.raises(CheckpointError, match="sliding_window"):
        cfg("MistralForCausalLM", sliding_window=0)


def test_qwen2_windows():
    q = "Qwen2ForCausalLM"
    assert cfg(q, sliding_window=32768).sliding_windows == ()            # use_sliding_window absent: off
    assert cfg(q, use_sliding_window=False, sliding_window=64).sliding_windows == ()
    assert cfg(q, use_sliding_window=True, sliding_window=64, max_window_layers=2).sliding_windows == \
        (None, None, 64, 64)                                             # layers >= max_window_layers slide
    assert cfg(q, use_sliding_window=True, sliding_window=64).sliding_windows == ()   # default 28 >= 4 layers
    types = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
    assert cfg(q, use_sliding_window=True, sliding_window=8, layer_types=types).sliding_windows == \
        (8, None, 8, None)
    assert cfg(q, use_sliding_window=False, sliding_window=8, layer_types=types).sliding_windows == ()
    with pytest.raises(CheckpointError, match="layer_types"):
        cfg(q, use_sliding_window=True, sliding_window=8, layer_types=["chunked_attention"] * 4)


def test_biases_follow_transformers_per_family():
    assert cfg("Qwen2ForCausalLM", attention_bias=False).attention_bias       # Qwen2 always has q/k/v biases
    assert not cfg("MistralForCausalLM", attention_bias=True, sliding_window=None).attention_bias
    assert not cfg("MistralForCausalLM", mlp_bias=True, sliding_window=None).mlp_bias
    assert cfg("LlamaForCausalLM", mlp_bias=True).mlp_bias
    llama = cfg("LlamaForCausalLM", attention_bias=True)                     # q/k/v and o_proj biases
    assert llama.attention_bias and llama.o_proj_bias
    qwen3 = cfg("Qwen3ForCausalLM", attention_bias=True)
    assert qwen3.attention_bias and qwen3.o_proj_bias
    assert not cfg("Qwen2ForCausalLM").o_proj_bias and not cfg("Qwen3ForCausalLM").attention_bias
    assert not cfg("Phi3ForCausalLM", attention_bias=True, mlp_bias=True).attention_bias   # Phi-3 has none


def test_family_defaults_follow_their_config_classes():
    """A key absent from config.json takes the value of the family's transformers config class."""
    assert cfg("Qwen3ForCausalLM").head_dim == 128                          # Qwen3Config's head_dim
    assert cfg("LlamaForCausalLM").head_dim == 8                            # hidden / heads
    assert cfg("Phi3ForCausalLM").rms_norm_eps == 1e-5 and cfg("LlamaForCausalLM").rms_norm_eps == 1e-6
    assert cfg("Phi3ForCausalLM").sliding_windows == ()                      # Phi3Config: no window by default
    assert cfg("Phi3ForCausalLM", sliding_window=16).sliding_windows == (16,) * 4
    q3 = cfg("Qwen3ForCausalLM", use_sliding_window=True, sliding_window=8, max_window_layers=3)
    assert q3.sliding_windows == (None, None, None, 8)


def longrope(n: int, **extra) -> dict:
    return {"rope_type": "longrope", "short_factor": [1.0] * n, "long_factor": [4.0] * n, **extra}


def test_longrope_and_partial_rotary():
    phi = cfg("Phi3ForCausalLM", max_position_embeddings=512, original_max_position_embeddings=128,
              rope_scaling=longrope(4))
    assert phi.rope_type == "longrope" and phi.rope_dim == 8 and phi.exact_positions == 128
    assert phi.rope_scaling_dict["original_max_position_embeddings"] == 128
    # Phi3Config's original_max_position_embeddings (4096 when absent) wins over rope_scaling's, as transformers
    assert cfg("Phi3ForCausalLM", max_position_embeddings=8192,
               rope_scaling=longrope(4, original_max_position_embeddings=64)).exact_positions == 4096
    # "su" and "yarn" are LongRoPE to Phi3Config
    assert cfg("Phi3ForCausalLM", rope_scaling={**longrope(4), "type": "su"}).rope_type == "longrope"
    partial = cfg("Phi3ForCausalLM", partial_rotary_factor=0.75, rope_scaling=longrope(3))
    assert partial.rope_dim == 6 and partial.head_dim == 8
    assert cfg("Phi3ForCausalLM").exact_positions == 4096 == cfg("Phi3ForCausalLM").max_position_embeddings


@pytest.mark.parametrize("arch,extra,match", [
    ("LlamaForCausalLM", {"hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ("Phi3ForCausalLM", {"rope_scaling": {"rope_type": "longrope", "short_factor": [1.0] * 3,
                                          "long_factor": [1.0] * 4}}, "short_factor must list 4"),
    ("Phi3ForCausalLM", {"rope_scaling": {"rope_type": "llama3", "factor": 2.0}}, "rope type 'llama3'"),
    ("Phi3ForCausalLM", {"partial_rotary_factor": 0.4}, "odd rotary dimension"),
    ("Qwen3ForCausalLM", {"hidden_act": "gelu_pytorch_tanh"}, "hidden_act"),
    ("Qwen3ForCausalLM", {"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    ("LlamaForCausalLM", {"sliding_window": 128}, "sliding_window 128"),
    ("LlamaForCausalLM", {"quantization_config": {"quant_method": "bitsandbytes"}}, "quantized.*bitsandbytes"),
    ("LlamaForCausalLM", {"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    ("LlamaForCausalLM", {"rope_scaling": {"rope_type": "linear", "factor": 2.0, "partial_rotary_factor": 0.5}},
     "partial_rotary_factor"),
    ("Qwen2ForCausalLM", {"final_logit_softcapping": 30.0}, "final_logit_softcapping"),
    ("MistralForCausalLM", {"rope_scaling": {"rope_type": "longrope"}}, "rope type 'longrope'"),
])
def test_unimplemented_fields_refuse_to_load(arch, extra, match):
    with pytest.raises(CheckpointError, match=match):
        cfg(arch, **extra)


def test_fields_without_effect_are_accepted():
    c = cfg("LlamaForCausalLM", sliding_window=None, pretraining_tp=2, attention_dropout=0.1, use_cache=False,
            hidden_act="swish", quantization_config=None)
    assert c.sliding_windows == ()
