"""Each pre-quantized format's reader returns its own config type (backend/model/gptq.py, awq.py)."""
from __future__ import annotations

import json

import pytest

from backend.model.awq import AwqConfig, read_awq_config
from backend.model.config import CheckpointError
from backend.model.gptq import GptqConfig, read_gptq_config

AWQ = {"quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 32, "version": "gemm"}}
GPTQ = {"quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 32}}


def test_awq_reader_reads_awq_only(tmp_path):
    assert isinstance(read_awq_config(tmp_path, AWQ), AwqConfig)
    assert read_awq_config(tmp_path, GPTQ) is None and read_awq_config(tmp_path, {}) is None


def test_gptq_reader_returns_a_gptq_config_and_refuses_another_method(tmp_path):
    assert isinstance(read_gptq_config(tmp_path, GPTQ), GptqConfig)
    assert read_gptq_config(tmp_path, {}) is None
    with pytest.raises(CheckpointError, match="quant_method 'awq'"):
        read_gptq_config(tmp_path, AWQ)


def test_gptq_reader_reads_the_legacy_quantize_config(tmp_path):
    (tmp_path / "quantize_config.json").write_text(json.dumps({"bits": 8, "group_size": -1}))
    cfg = read_gptq_config(tmp_path, {})
    assert isinstance(cfg, GptqConfig) and cfg.bits == 8 and cfg.source.endswith("quantize_config.json")
