"""Served adapters: ``lora_adapters`` pairs and ``lora_dir``'s sub-folders, a bad adapter failing the engine's
load naming its field, and the CPU cache's LRU reading evicted adapters back from their folders."""
from __future__ import annotations


import pytest

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.lora.adapter_config import LoraConfigError
from backend.lora.registry import LoraRegistry, adapter_folders
from backend.model.config import ModelConfig
from contracts.sampling_params import SamplingParams
from tests.backend.lora.test_adapter_config import BASE, lora_tensors, write
from tests.helpers.checkpoints import DEMO_TARGET


@pytest.fixture
def cfg() -> ModelConfig:
    return ModelConfig.from_file(DEMO_TARGET / "config.json")


def test_folders_from_pairs_and_a_scanned_dir(tmp_path, cfg):
    for name in ("a", "b"):
        write(tmp_path / "dir" / name, BASE, lora_tensors(cfg, 4))
    (tmp_path / "dir" / "not-an-adapter").mkdir()
    write(tmp_path / "c", BASE, lora_tensors(cfg, 4))
    folders = adapter_folders((("c", str(tmp_path / "c")),), str(tmp_path / "dir"))
    assert sorted(folders) == ["a", "b", "c"]
    with pytest.raises(LoraConfigError, match="lora_dir: adapter 'a'"):
        adapter_folders((("a", str(tmp_path / "c")),), str(tmp_path / "dir"))
    with pytest.raises(LoraConfigError, match="lora_dir"):
        adapter_folders((), str(tmp_path / "missing"))
    reg = LoraRegistry(folders, cfg, max_cpu_loras=1, max_rank=16)
    assert reg.loaded_names() == ["b"]                 # checked in order (pairs, then the folder); one kept
    assert reg.get("a").name == "a" and reg.loaded_names() == ["a"]
    with pytest.raises(ValueError, match="lora_name: unknown adapter 'x'"):
        reg.check_name("x")
    with pytest.raises(LoraConfigError, match="max_lora_rank"):
        LoraRegistry(folders, cfg, max_cpu_loras=3, max_rank=2)


def test_a_bad_adapter_fails_the_engine_load_naming_its_field(tmp_path, cfg):
    write(tmp_path / "dora", dict(BASE, use_dora=True), lora_tensors(cfg, 4))
    with pytest.raises(LoraConfigError, match="use_dora"):
        LLMEngine(EngineConfig.from_settings(model_path=str(DEMO_TARGET), lora_adapters=(("dora",
                                                                                          str(tmp_path / "dora")),)))
    with pytest.raises(ValueError, match="lora_adapters: LoRA over a quantized base"):
        EngineConfig.from_settings(model_path=str(DEMO_TARGET), lora_adapters=(("x", "y"),), quantization="int8")
    with pytest.raises(ValueError, match="max_cpu_loras"):
        EngineConfig.from_settings(model_path=str(DEMO_TARGET), lora_dir="x", max_loras=4, max_cpu_loras=2)
    engine = LLMEngine(EngineConfig.from_settings(model_path=str(DEMO_TARGET)))
    with pytest.raises(ValueError, match="lora_name: 'a': this engine serves no LoRA adapters"):
        engine.add_request("r", [0, 5, 6], SamplingParams(lora_name="a"), lambda out: None)
    engine.shutdown()


def test_parameters_parse(tmp_path):
    cfg = EngineConfig.from_parameters({"model_path": "m", "lora_adapters": "a=/x, b=rel/y", "max_loras": "2",
                                        "max_cpu_loras": "none", "lora_dir": "none"})
    assert cfg.lora.lora_adapters == (("a", "/x"), ("b", "rel/y")) and cfg.lora.max_loras == 2 and cfg.lora.enabled
    with pytest.raises(ValueError, match="lora_adapters: expected name=folder"):
        EngineConfig.from_parameters({"model_path": "m", "lora_adapters": "a"})
    assert not EngineConfig.from_settings(model_path="m").lora.enabled
