"""preprocess.tokenizer: loading a checkpoint's tokenizer files, BOS rules, identity hash."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from preprocess.tokenizer import TokenizerError, load_tokenizer, read_tokenizer_config
from tests.helpers.checkpoints import DEMO_TARGET  # noqa: E402

DEMO = DEMO_TARGET


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(DEMO)


def _copy_demo(dst: Path, config_edit=None) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(DEMO / name, dst / name)
    if config_edit is not None:
        cfg = json.loads((dst / "tokenizer_config.json").read_text())
        config_edit(cfg)
        (dst / "tokenizer_config.json").write_text(json.dumps(cfg))
    return dst


def test_demo_special_tokens(tok):
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (0, 1, 2)
    assert tok.special_token_ids == frozenset(range(7))
    assert tok.vocab_size == 4096
    assert tok.chat_template and "add_generation_prompt" in tok.chat_template
    assert tok.model_max_length == 1024
    assert tok.config.additional_special_tokens == ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>")


def test_encode_adds_bos_only_with_special_tokens(tok):
    with_bos = tok.encode("def main():\n    return 1", add_special_tokens=True)
    plain = tok.encode("def main():\n    return 1", add_special_tokens=False)
    assert with_bos == [tok.bos_token_id] + plain
    assert tok.decode(with_bos) == "def main():\n    return 1"
    assert tok.decode(with_bos, skip_special_tokens=False).startswith("<|bos|>def")


def test_encode_matches_transformers(tok):
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast.from_pretrained(str(DEMO))
    for text in ["hello world", " leading space", "你好 😀 ok", "<|user|>x<|end|>", "a\n\n\tb"]:
        assert tok.encode(text) == hf(text)["input_ids"], text
        assert tok.encode(text, add_special_tokens=False) == hf(text, add_special_tokens=False)["input_ids"]


def test_add_bos_token_false_in_config_overrides_tokenizer_json(tmp_path):
    folder = _copy_demo(tmp_path / "nobos", lambda c: c.update(add_bos_token=False))
    tok = load_tokenizer(folder)
    assert tok.encode("hello") == tok.encode("hello", add_special_tokens=False)


def test_add_eos_token_true_appends_eos(tmp_path):
    folder = _copy_demo(tmp_path / "eos", lambda c: c.update(add_eos_token=True))
    tok = load_tokenizer(folder)
    ids = tok.encode("hello")
    assert ids[0] == 0 and ids[-1] == 1


def test_hf_dict_special_tokens(tmp_path):
    def edit(c):
        c["bos_token"] = {"content": "<|bos|>", "lstrip": False, "normalized": False, "__type": "AddedToken"}
        c["eos_token"] = {"content": "<|end|>"}
    tok = load_tokenizer(_copy_demo(tmp_path / "dict", edit))
    assert tok.config.bos_token == "<|bos|>" and tok.bos_token_id == 0
    assert tok.eos_token_id == 6
    assert tok.template_variables()["eos_token"] == "<|end|>"


def test_bad_special_token_type_names_file(tmp_path):
    folder = _copy_demo(tmp_path / "bad", lambda c: c.update(bos_token=42))
    with pytest.raises(TokenizerError, match="tokenizer_config.json: bos_token"):
        load_tokenizer(folder)


def test_generation_config_eos_ids_come_first(tmp_path):
    folder = _copy_demo(tmp_path / "gen")
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [6, 1]}))
    assert load_tokenizer(folder).eos_token_ids == (6, 1)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": 6}))
    assert load_tokenizer(folder).eos_token_ids == (6, 1)  # tokenizer EOS appended
    assert read_tokenizer_config(folder).generation_eos_token_ids == (6,)


def test_missing_or_broken_tokenizer_json(tmp_path):
    with pytest.raises(TokenizerError, match="tokenizer.json: missing"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="tokenizer.json"):
        load_tokenizer(tmp_path)


def test_identity_is_stable_and_sensitive(tmp_path, tok):
    assert load_tokenizer(DEMO).identity == tok.identity
    assert len(tok.identity) == 64
    same = load_tokenizer(_copy_demo(tmp_path / "same"))
    assert same.identity == tok.identity  # path does not matter
    other = load_tokenizer(_copy_demo(tmp_path / "other", lambda c: c.update(add_bos_token=False)))
    assert other.identity != tok.identity
    data = json.loads((DEMO / "tokenizer.json").read_text())
    data["added_tokens"][0]["content"] = "<|BOS|>"
    folder = _copy_demo(tmp_path / "changed")
    (folder / "tokenizer.json").write_text(json.dumps(data))
    assert load_tokenizer(folder).identity != tok.identity
