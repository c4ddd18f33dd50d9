"""The committed demo adapter (models/demo-lora/torch-style, trained by tools/train_lora.py on the torch-source
corpus) and the trainer: the adapter loads with the engine's loader, changes the engine's greedy output on code
in its corpus's style, and lowers the loss on held-out files of that corpus; two training steps write a PEFT
folder the engine's loader reads."""
from __future__ import annotations

import json

import pytest
import torch

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine, output_token_ids
from backend.lora.adapter import load_adapter
from backend.model.config import ModelConfig
from contracts.sampling_params import SamplingParams
from tests.helpers.checkpoints import DEMO_LORA
from tools.train_lora import DEFAULT_TARGETS, causal_lm_loss, train_adapter

PROMPTS = [   # code in the style of torch/nn (the demo target learnt the stdlib)
    "class Block(nn.Module):\n    def __init__(self, dim):\n        super().__init__()\n        self.",
    "    def forward(self, x):\n        x = self.",
    "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n\n",
    "def reset_parameters(self) -> None:\n    if isinstance(module, nn.Linear):\n",
]
NEW_TOKENS = 16
HELDOUT_TOKENS = 512


@pytest.fixture(scope="module")
def tokenizer(demo_target):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(demo_target / "tokenizer.json"))


def test_the_demo_adapter_loads_with_the_engines_loader(demo_target):
    adapter = load_adapter(DEMO_LORA, "torch-style", ModelConfig.from_file(demo_target / "config.json"))
    stats = json.loads((DEMO_LORA / "training_stats.json").read_text())
    assert adapter.max_rank == stats["rank"]
    assert {m for _, m in adapter.parts} == set(stats["targets"]) and len(adapter.parts) == 4 * len(stats["targets"])
    assert all(p.b.abs().max() > 0 for p in adapter.parts.values())   # trained: no lora_B left at PEFT's zero


def test_the_demo_adapter_changes_greedy_output(demo_target, tokenizer):
    engine = LLMEngine(EngineConfig.from_settings(model_path=str(demo_target), lora_adapters=(("torch-style",
                                                                                               str(DEMO_LORA)),)))
    try:
        prompts = [tokenizer.encode(p).ids for p in PROMPTS]
        outs = {name: [output_token_ids(o) for o in engine.generate(prompts, SamplingParams(
                    max_tokens=NEW_TOKENS, temperature=0.0, lora_name=name))] for name in (None, "torch-style")}
    finally:
        engine.shutdown()
    changed = sum(a != b for a, b in zip(outs[None], outs["torch-style"]))
    assert changed >= len(PROMPTS) / 2, f"the adapter changes only {changed} of {len(PROMPTS)} outputs"


def test_the_demo_adapter_lowers_the_heldout_loss(demo_target, tokenizer):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from bench.harness.corpus import torch_corpus_files
    from tools.train_model import heldout_loss
    from tools.training import encode_files

    _, heldout_files = torch_corpus_files()
    ids = encode_files(tokenizer, heldout_files[:2])[:HELDOUT_TOKENS + 1]
    assert len(ids) == HELDOUT_TOKENS + 1
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(demo_target), dtype=torch.float32),
                                      str(DEMO_LORA))
    adapted = heldout_loss(model, ids, 128, loss_fn=causal_lm_loss)
    with model.disable_adapter():
        base = heldout_loss(model, ids, 128, loss_fn=causal_lm_loss)
    assert adapted < base - 0.05, f"held-out loss: adapter {adapted:.3f}, base {base:.3f}"


def test_two_training_steps_write_an_adapter_the_engine_loads(demo_target, tmp_path):
    stats = train_adapter(demo_target, tmp_path / "a", rank=4, steps=2, batch=2, seq_len=32, heldout_tokens=64)
    assert stats["steps"] == 2 and stats["rank"] == 4
    assert sorted(f.name for f in (tmp_path / "a").iterdir()) == [
        "adapter_config.json", "adapter_model.safetensors", "training_stats.json"]
    adapter = load_adapter(tmp_path / "a", "a", ModelConfig.from_file(demo_target / "config.json"))
    assert adapter.max_rank == 4 and {m for _, m in adapter.parts} == set(DEFAULT_TARGETS)
