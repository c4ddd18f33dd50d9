"""AWQ checkpoints (backend/model/awq.py, AutoAWQ's GEMM layout) written by tools/make_gptq_checkpoint.py --awq:
AWQ's interleaved packing, loaded exactly onto our int4 with zero points, served, refused when unsupported."""
from __future__ import annotations

import json

import pytest
import torch

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine, output_token_ids
from backend.model.awq import pack_awq, unpack_awq
from backend.model.config import CheckpointError, ModelConfig
from backend.model.loader import load_model, read_hf_tensors
from backend.model.quant import linear_targets
from contracts.sampling_params import SamplingParams
from tests.helpers.oracle import dense_greedy
from tools.make_gptq_checkpoint import gptq_round_to_nearest, make

PROMPT = [0, 17, 230, 999, 45, 3000, 12]


def test_packing_is_autoawqs_interleaved_order():
    v = torch.arange(8, dtype=torch.int32)[None, :].repeat(2, 1)      # column c holds the value c
    word = pack_awq(v)
    # AutoAWQ: nibble i of a word holds column order_map[i], order_map = [0, 2, 4, 6, 1, 3, 5, 7]
    assert word.tolist() == [[sum(c << (4 * i) for i, c in enumerate((0, 2, 4, 6, 1, 3, 5, 7)))]] * 2
    many = torch.randint(0, 16, (5, 64), dtype=torch.int32)
    assert torch.equal(unpack_awq(pack_awq(many)), many)


def test_loaded_weights_are_awqs_dequantization_and_the_engine_serves_them(tiny_checkpoint, tmp_path):
    ckpt = make(tiny_checkpoint, tmp_path / "awq", group=32, awq=True)
    model = load_model(ckpt)
    hf = read_hf_tensors(tiny_checkpoint, ModelConfig.from_dict(json.loads((tiny_checkpoint / "config.json").read_text())))
    n, zero, scale = gptq_round_to_nearest(hf["model.layers.1.mlp.down_proj.weight"], 4, 32, False)
    ref = ((n - zero.repeat_interleave(32, 0)) * scale.float().repeat_interleave(32, 0)).t()
    layer = model.layers[1].mlp.down_proj
    assert layer.mode == "int4" and layer.zeros is not None and torch.equal(layer.dequantized(), ref)
    reference = load_model(tiny_checkpoint)
    for (parent_q, attr), (parent_r, _) in zip(linear_targets(model).values(), linear_targets(reference).values()):
        getattr(parent_r, attr).weight.copy_(getattr(parent_q, attr).dequantized())
    expected = dense_greedy(reference, PROMPT, 8, banned=(1,))
    engine = LLMEngine(EngineConfig.from_settings(model_path=str(ckpt), kv_cache_bytes=8 << 20, device="cpu"))
    outs, = engine.generate([PROMPT], SamplingParams(max_tokens=8, min_tokens=8, temperature=0.0))
    assert output_token_ids(outs) == expected
    with pytest.raises(ValueError, match=r"^quantization: 'int8' conflicts with the pre-quantized checkpoint \(AWQ"):
        LLMEngine(EngineConfig.from_settings(model_path=str(ckpt), quantization="int8", kv_cache_bytes=8 << 20,
                                             device="cpu"))


@pytest.mark.parametrize("changes,message", [
    ({"bits": 8}, r"config\.json: quantization_config\.bits 8 is not supported for awq"),
    ({"version": "gemv"}, r"config\.json: quantization_config\.version 'gemv' is not supported"),
    ({"zero_point": False}, r"quantization_config\.zero_point false"),
    ({"group_size": 48}, r"quantization_config\.group_size 48 does not divide model\.layers\.0\."),
])
def test_unsupported_awq_settings_name_the_file_and_field(tiny_checkpoint, tmp_path, changes, message):
    ckpt = make(tiny_checkpoint, tmp_path / "awq", group=32, awq=True)
    raw = json.loads((ckpt / "config.json").read_text())
    raw["quantization_config"].update(changes)
    (ckpt / "config.json").write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match=message):
        load_model(ckpt)
