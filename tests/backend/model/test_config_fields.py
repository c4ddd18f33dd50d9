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


@pytest.mark.parametrize("arch,extra,match", [
    ("LlamaForCausalLM", {"hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ("LlamaForCausalLM", {"attention_bias": True}, "attention_bias"),
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
