"""PEFT adapter configs and weights: what is honoured, and every refusal naming its field."""
from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import save_file

from backend.lora.adapter import load_adapter, module_shapes
from backend.lora.adapter_config import LoraConfigError, parse_adapter_config
from backend.model.config import ModelConfig
from tests.helpers.checkpoints import DEMO_TARGET

BASE = {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"], "bias": "none",
        "lora_dropout": 0.1, "task_type": "CAUSAL_LM", "use_dora": False, "modules_to_save": None}


def test_scaling_rank_patterns_and_rslora():
    cfg = parse_adapter_config(dict(BASE, rank_pattern={"v_proj": 2}, alpha_pattern={"q_proj": 2}), "t")
    assert cfg.module_rank("model.layers.0.self_attn.v_proj") == 2
    assert cfg.module_rank("model.layers.0.self_attn.q_proj") == 4
    assert cfg.module_scaling("model.layers.3.self_attn.q_proj") == 2 / 4
    assert cfg.module_scaling("model.layers.3.self_attn.v_proj") == 8 / 2
    assert parse_adapter_config(dict(BASE, use_rslora=True), "t").module_scaling("x.q_proj") == 8 / math.sqrt(4)
    assert parse_adapter_config(dict(BASE, target_modules="all-linear"), "t").target_modules >= {"down_proj"}


@pytest.mark.parametrize("field,value", [
    ("use_dora", True), ("modules_to_save", ["lm_head"]), ("fan_in_fan_out", True), ("lora_bias", True),
    ("bias", "all"), ("target_modules", ["embed_tokens"]), ("target_modules", ["lm_head"]),
    ("target_modules", ".*proj"), ("peft_type", "IA3"), ("layers_pattern", "h"), ("r", 0),
    ("exclude_modules", ["q_proj"]), ("trainable_token_indices", [1]), ("some_new_field", 3),
])
def test_refusals_name_the_field(field, value):
    with pytest.raises(LoraConfigError, match=field):
        parse_adapter_config(dict(BASE, **{field: value}), "t")


@pytest.fixture
def cfg() -> ModelConfig:
    return ModelConfig.from_file(DEMO_TARGET / "config.json")


def write(folder, config: dict, tensors: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "adapter_config.json").write_text(json.dumps(config))
    if tensors is not None:
        save_file(tensors, str(folder / "adapter_model.safetensors"))


def lora_tensors(cfg: ModelConfig, r: int, modules=("q_proj", "v_proj"), layers=None) -> dict:
    out = {}
    for layer in range(cfg.num_hidden_layers) if layers is None else layers:
        for m in modules:
            n, k = module_shapes(cfg)[m]
            p = f"base_model.model.model.layers.{layer}.{'self_attn' if m[0] in 'qkvo' else 'mlp'}.{m}"
            out[p + ".lora_A.weight"], out[p + ".lora_B.weight"] = torch.randn(r, k), torch.randn(n, r)
    return out


def test_load_folds_the_scaling_into_b(tmp_path, cfg):
    tensors = lora_tensors(cfg, 4)
    write(tmp_path / "a", BASE, tensors)
    adapter = load_adapter(tmp_path / "a", "a", cfg)
    part = adapter.parts[(1, "v_proj")]
    torch.testing.assert_close(part.b, tensors["base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight"] * 2)
    assert adapter.max_rank == 4 and len(adapter.parts) == 2 * cfg.num_hidden_layers


def test_layers_to_transform(tmp_path, cfg):
    write(tmp_path / "a", dict(BASE, layers_to_transform=[1]), lora_tensors(cfg, 4, layers=[1]))
    assert {layer for layer, _ in load_adapter(tmp_path / "a", "a", cfg).parts} == {1}
    write(tmp_path / "b", dict(BASE, layers_to_transform=[1]), lora_tensors(cfg, 4, layers=[0, 1]))
    with pytest.raises(LoraConfigError, match="layers_to_transform"):
        load_adapter(tmp_path / "b", "b", cfg)


@pytest.mark.parametrize("case,match", [
    ("missing_config", "adapter_config.json is missing"), ("missing_weights", "adapter_model.safetensors is missing"),
    ("wrong_rank", r"r=4"), ("wrong_shape", "do not match"), ("untargeted", "not in target_modules"),
    ("embedding", "not a LoRA weight"), ("half", "lora_B is missing"),
])
def test_bad_adapters_fail_naming_what(tmp_path, cfg, case, match):
    folder = tmp_path / case
    tensors = lora_tensors(cfg, 4)
    key = "base_model.model.model.layers.0.self_attn.q_proj"
    if case == "missing_config":
        folder.mkdir()
    elif case == "missing_weights":
        write(folder, BASE, None)
    else:
        if case == "wrong_rank":
            tensors = lora_tensors(cfg, 3)
        elif case == "wrong_shape":
            tensors[key + ".lora_B.weight"] = torch.randn(7, 4)
        elif case == "untargeted":
            tensors.update(lora_tensors(cfg, 4, modules=("k_proj",)))
        elif case == "embedding":
            tensors["base_model.model.model.embed_tokens.lora_embedding_A"] = torch.randn(4, 8)
        elif case == "half":
            del tensors[key + ".lora_B.weight"]
        write(folder, BASE, tensors)
    with pytest.raises(LoraConfigError, match=match):
        load_adapter(folder, case, cfg)


def phi3_config() -> ModelConfig:
    return ModelConfig.from_dict({"architectures": ["Phi3ForCausalLM"], "vocab_size": 4096, "hidden_size": 64,
                                  "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
                                  "num_key_value_heads": 2})


def test_a_fused_family_takes_its_fused_targets(tmp_path):
    """Phi-3's checkpoint fuses q/k/v and gate/up: its adapters (``all-linear`` too) target qkv_proj, o_proj,
    gate_up_proj and down_proj, each fused module's B covering every row of our fused projection."""
    from backend.lora.layout import projection_layout

    phi3 = phi3_config()
    assert module_shapes(phi3) == {"qkv_proj": (128, 64), "o_proj": (64, 64), "gate_up_proj": (192, 64),
                                   "down_proj": (64, 96)}
    assert projection_layout(phi3)["qkv"] == (128, 64, [("qkv_proj", 0, 128)])
    modules = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
    write(tmp_path / "a", dict(BASE, target_modules="all-linear"), lora_tensors(phi3, 4, modules))
    assert {m for _, m in load_adapter(tmp_path / "a", "a", phi3).parts} == set(modules)
    write(tmp_path / "b", dict(BASE, target_modules=["qkv_proj", "k_proj"]), lora_tensors(phi3, 4, ("qkv_proj",)))
    with pytest.raises(LoraConfigError, match=r"target_modules \['k_proj'\] are not projections of the Phi3"):
        load_adapter(tmp_path / "b", "b", phi3)


def test_trtllm_split_module_ids_on_a_fused_family_are_refused_naming_lora_config():
    import numpy as np

    from backend.lora.trtllm import adapter_from_trtllm

    weights = np.zeros((1, 4 * 64 + 64 * 4), dtype=np.float32)
    with pytest.raises(ValueError, match=r"lora_config: row 0: module id 1 \(q_proj\) is not a projection of the "
                                         r"Phi3ForCausalLM base"):
        adapter_from_trtllm(5, weights, np.asarray([[1, 0, 4]], dtype=np.int32), phi3_config(), 16)
