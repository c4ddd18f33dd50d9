"""Checkpoint loading: HF layouts load and match transformers; every bad checkpoint gets a clear error."""
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from backend.model.config import CheckpointError
from backend.model.loader import load_model
from tests.helpers.checkpoints import make_random_checkpoint
from tests.helpers.oracle import dense_logits

IDS = [5, 17, 300, 42, 1024, 7, 99, 3000, 11]


def _hf_logits(folder):
    hf = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    with torch.no_grad():
        return hf(torch.tensor([IDS])).logits[0]


@pytest.mark.parametrize("arch,extra", [
    ("LlamaForCausalLM", {}),
    ("LlamaForCausalLM", {"tie_word_embeddings": False}),
    ("LlamaForCausalLM", {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                           "high_freq_factor": 4.0, "original_max_position_embeddings": 64}}),
    ("MistralForCausalLM", {"model_type": "mistral", "sliding_window": None}),
    ("Qwen2ForCausalLM", {"model_type": "qwen2", "use_sliding_window": False}),
], ids=["llama-tied", "llama-untied", "llama3-rope", "mistral", "qwen2-bias"])
def test_layouts_match_transformers(tmp_path, arch, extra):
    folder = make_random_checkpoint(tmp_path / "ck", extra={"architectures": [arch], **extra},
                                    tie=extra.get("tie_word_embeddings", True))
    ours = dense_logits(load_model(folder), IDS)
    torch.testing.assert_close(ours, _hf_logits(folder), rtol=1e-4, atol=1e-4)


def test_sharded_checkpoint_with_index(tmp_path, tiny_checkpoint):
    folder = tmp_path / "sharded"
    shutil.copytree(tiny_checkpoint, folder)
    tensors = load_file(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    weight_map = {}
    for fname, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, str(folder / fname))
        weight_map.update({k: fname for k in keys})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    torch.testing.assert_close(dense_logits(load_model(folder), IDS), dense_logits(load_model(tiny_checkpoint), IDS))
    (folder / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"model-00002-of-00002.safetensors: missing file"):
        load_model(folder)


def _edit_config(folder, **changes):
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(changes)
    (folder / "config.json").write_text(json.dumps(cfg))


@pytest.fixture
def ckpt(tmp_path, tiny_checkpoint):
    folder = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint, folder)
    return folder


def test_missing_folder(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_model(tmp_path / "nope")


def test_missing_config(ckpt):
    (ckpt / "config.json").unlink()
    with pytest.raises(CheckpointError, match=r"config.json: missing file"):
        load_model(ckpt)


def test_unsupported_architecture(ckpt):
    _edit_config(ckpt, architectures=["GPT2LMHeadModel"])
    with pytest.raises(CheckpointError, match=r"config.json: unsupported architectures \['GPT2LMHeadModel'\]"):
        load_model(ckpt)


def test_unknown_rope_type(ckpt):
    _edit_config(ckpt, rope_scaling={"rope_type": "mystery", "factor": 2.0})
    with pytest.raises(CheckpointError, match="config.json: unknown rope type 'mystery'"):
        load_model(ckpt)


def test_missing_weights_file(ckpt):
    (ckpt / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="missing file model.safetensors"):
        load_model(ckpt)


def test_missing_tensor(ckpt):
    tensors = load_file(str(ckpt / "model.safetensors"))
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, str(ckpt / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"missing tensor 'model.layers.1.mlp.up_proj.weight'"):
        load_model(ckpt)


def test_misshaped_tensor(ckpt):
    tensors = load_file(str(ckpt / "model.safetensors"))
    tensors["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(3, 64)
    save_file(tensors, str(ckpt / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"model.safetensors: tensor 'model.layers.0.self_attn.k_proj.weight' "
                                              r"has shape \(3, 64\), expected \(32, 64\)"):
        load_model(ckpt)


def test_vocab_mismatch(ckpt):
    # shrink the embedding below the tokenizer's id space
    _edit_config(ckpt, vocab_size=1000)
    with pytest.raises(CheckpointError, match=r"tokenizer.json: tokenizer has 4096 ids but the embedding has 1000 rows"):
        load_model(ckpt)


def test_missing_tokenizer(ckpt):
    (ckpt / "tokenizer.json").unlink()
    with pytest.raises(CheckpointError, match=r"tokenizer.json: missing file"):
        load_model(ckpt)


def test_corrupt_safetensors(ckpt):
    (ckpt / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match="unreadable safetensors file"):
        load_model(ckpt)


def test_bad_head_counts(ckpt):
    _edit_config(ckpt, num_key_value_heads=3)
    with pytest.raises(CheckpointError, match="not a multiple of num_key_value_heads 3"):
        load_model(ckpt)
