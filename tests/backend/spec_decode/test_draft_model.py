"""Draft checkpoints that cannot speculate for the target fail to load, naming draft_model_path."""
from __future__ import annotations

import json
import shutil

import pytest

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from tests.helpers.checkpoints import make_random_checkpoint


def config(target, draft) -> EngineConfig:
    return EngineConfig.from_settings(model_path=str(target), speculative_method="draft", draft_model_path=str(draft),
                                      kv_cache_bytes=8 << 20, device="cpu")


def test_missing_draft_folder(tiny_checkpoint, tmp_path):
    with pytest.raises(ValueError, match="^draft_model_path: .*config.json"):
        LLMEngine(config(tiny_checkpoint, tmp_path / "nowhere"))


def test_draft_with_another_tokenizer(tiny_checkpoint, tmp_path):
    draft = make_random_checkpoint(tmp_path / "d", layers=1, hidden=32, heads=2, kv_heads=1, intermediate=64, seed=4)
    tok = json.loads((draft / "tokenizer.json").read_text())
    tok["added_tokens"][0]["content"] = "<|other|>"
    (draft / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(ValueError, match="^draft_model_path: .*tokenizer"):
        LLMEngine(config(tiny_checkpoint, draft))


def test_draft_with_another_vocabulary(tiny_checkpoint, tmp_path):
    draft = make_random_checkpoint(tmp_path / "v", layers=1, hidden=32, heads=2, kv_heads=1, intermediate=64,
                                   extra={"vocab_size": 5000})
    with pytest.raises(ValueError, match="^draft_model_path: .*vocab_size"):
        LLMEngine(config(tiny_checkpoint, draft))


def test_draft_without_a_tokenizer(tiny_checkpoint, tmp_path):
    draft = tmp_path / "nt"
    shutil.copytree(tiny_checkpoint, draft)
    (draft / "tokenizer.json").unlink()
    with pytest.raises(ValueError, match="^draft_model_path: .*tokenizer.json"):
        LLMEngine(config(tiny_checkpoint, draft))
