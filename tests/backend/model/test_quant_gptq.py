"""GPTQ checkpoints (backend/model/gptq.py): written by tools/make_gptq_checkpoint.py from a float checkpoint,
loaded onto our int4/int8 formats exactly, served by the engine, and refused clearly when unsupported."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine, output_token_ids
from backend.model.config import CheckpointError
from backend.model.prequantized import pack_cols, pack_rows, unpack_cols, unpack_rows
from backend.model.loader import load_model, read_hf_tensors
from backend.model.quant import QuantLinear, linear_targets, quantize_model
from contracts.sampling_params import SamplingParams
from tests.helpers.oracle import dense_greedy, dense_logits
from tools.make_gptq_checkpoint import gptq_round_to_nearest, make

PROMPT = [0, 17, 230, 999, 45, 3000, 12]
FUSED = {"self_attn.qkv_proj": ("q", "k", "v"), "self_attn.o_proj": ("o",), "mlp.gate_up_proj": ("gate", "up"),
         "mlp.down_proj": ("down",)}


@pytest.mark.parametrize("bits", [4, 8])
def test_packing_round_trips_including_the_sign_bit(bits):
    v = torch.randint(0, 1 << bits, (64, 24), dtype=torch.int32)
    v[-1] = (1 << bits) - 1                               # the top value in the last slot: a negative int32 word
    rows, cols = pack_rows(v, bits), pack_cols(v, bits)
    assert rows.dtype == cols.dtype == torch.int32 and rows.shape == (64 * bits // 32, 24)
    assert cols.shape == (64, 24 * bits // 32) and (rows < 0).any()
    assert torch.equal(unpack_rows(rows, bits), v) and torch.equal(unpack_cols(cols, bits), v)


def reference_weight(src, name: str, bits: int, group: int, sym: bool) -> torch.Tensor:  # [out, in]
    """GPTQ's dequantization of what the tool wrote, from its unpacked integers: (n - zero) * scale."""
    raw = json.loads((src / "config.json").read_text())
    from backend.model.config import ModelConfig
    hf = read_hf_tensors(src, ModelConfig.from_dict(raw))
    n, zero, scale = gptq_round_to_nearest(hf[name], bits, group, sym)
    return ((n - zero.repeat_interleave(group, 0)) * scale.float().repeat_interleave(group, 0)).t()


@pytest.mark.parametrize("bits,group,sym,fmt", [(4, 32, True, "gptq"), (4, 64, False, "gptq"),
                                                (4, 32, False, "gptq_v2"), (8, 32, True, "gptq"),
                                                (8, -1, True, "gptq_v2"), (4, 16, True, "gptq")])
def test_loaded_weights_are_gptqs_dequantization_exactly(tiny_checkpoint, tmp_path, bits, group, sym, fmt):
    ckpt = make(tiny_checkpoint, tmp_path / "gptq", bits=bits, group=group, sym=sym, fmt=fmt)
    model = load_model(ckpt)
    for key, (parent, attr) in linear_targets(model).items():
        layer = getattr(parent, attr)
        assert isinstance(layer, QuantLinear) and layer.mode == ("int4" if bits == 4 else "int8")
        i, ours = key.split(".", 2)[1], key.split(".", 2)[2]
        part = ours.split(".")[0]
        names = [f"model.layers.{i}.{part}.{p}_proj.weight" for p in FUSED[ours]]
        ref = torch.cat([reference_weight(tiny_checkpoint, n, bits, 64 if group == -1 and "down" not in n else
                                          (128 if group == -1 else group), sym) for n in names])
        assert torch.equal(layer.dequantized(), ref), key
    assert (model.layers[0].mlp.gate_up_proj.zeros is None) == (sym or bits == 8)


@pytest.mark.parametrize("bits", [4, 8])
def test_logits_err_like_our_own_quantization_of_the_same_weights(tiny_checkpoint, tmp_path, bits):
    ckpt = make(tiny_checkpoint, tmp_path / "gptq", bits=bits, group=32)
    full = dense_logits(load_model(tiny_checkpoint), PROMPT)
    ours = load_model(tiny_checkpoint)
    quantize_model(ours, "int4" if bits == 4 else "int8", 32)
    err_gptq = (dense_logits(load_model(ckpt), PROMPT) - full).abs().mean()
    err_ours = (dense_logits(ours, PROMPT) - full).abs().mean()
    assert 0 < err_gptq < 2 * err_ours


def test_engine_serves_a_gptq_checkpoint_as_dense_decoding_of_its_weights(tiny_checkpoint, tmp_path):
    ckpt = make(tiny_checkpoint, tmp_path / "gptq", bits=4, group=32, sym=False)
    quantized = load_model(ckpt)
    reference = load_model(tiny_checkpoint)
    for (parent_q, attr), (parent_r, _) in zip(linear_targets(quantized).values(), linear_targets(reference).values()):
        getattr(parent_r, attr).weight.copy_(getattr(parent_q, attr).dequantized())
    expected = dense_greedy(reference, PROMPT, 10, banned=(1,))
    for mode in ("none", "int4"):                        # the checkpoint's own format, or nothing asked
        engine = LLMEngine(EngineConfig.from_settings(model_path=str(ckpt), quantization=mode, kv_cache_bytes=8 << 20,
                                                      device="cpu"))
        outs, = engine.generate([PROMPT], SamplingParams(max_tokens=10, min_tokens=10, temperature=0.0))
        assert output_token_ids(outs) == expected
    with pytest.raises(ValueError, match=r"^quantization: 'int8' conflicts with the pre-quantized checkpoint \(GPTQ"):
        LLMEngine(EngineConfig.from_settings(model_path=str(ckpt), quantization="int8", kv_cache_bytes=8 << 20,
                                             device="cpu"))


def edit_config(ckpt, **changes):
    path = ckpt / "config.json"
    raw = json.loads(path.read_text())
    raw["quantization_config"].update(changes)
    path.write_text(json.dumps(raw))


@pytest.mark.parametrize("changes,message", [
    ({"quant_method": "bitsandbytes"}, r"config\.json: quantized checkpoints other than GPTQ and AWQ .*'bitsandbytes'"),
    ({"bits": 3}, r"config\.json: quantization_config\.bits 3 is not supported"),
    ({"group_size": 48}, r"config\.json: quantization_config\.group_size 48 does not divide model\.layers\.0\."),
    ({"checkpoint_format": "marlin"}, r"checkpoint_format 'marlin' is not supported"),
    ({"lm_head": True}, r"quantization_config\.lm_head true"),
])
def test_unsupported_settings_name_the_file_and_field(tiny_checkpoint, tmp_path, changes, message):
    ckpt = make(tiny_checkpoint, tmp_path / "gptq", bits=4, group=32)
    edit_config(ckpt, **changes)
    with pytest.raises(CheckpointError, match=message):
        load_model(ckpt)


def test_act_order_and_asymmetric_8_bit_are_refused_naming_the_tensor(tiny_checkpoint, tmp_path):
    ckpt = make(tiny_checkpoint, tmp_path / "g4", bits=4, group=32)
    tensors = load_file(str(ckpt / "model.safetensors"))
    name = "model.layers.1.mlp.up_proj.g_idx"
    tensors[name] = tensors[name].flip(0).contiguous()
    save_file(tensors, str(ckpt / "model.safetensors"))
    edit_config(ckpt, desc_act=True)
    with pytest.raises(CheckpointError, match=r"config\.json: tensor model\.layers\.1\.mlp\.up_proj\.g_idx is not"):
        load_model(ckpt)
    ckpt8 = make(tiny_checkpoint, tmp_path / "g8", bits=8, group=32, sym=False)
    with pytest.raises(CheckpointError, match=r"qzeros: 8-bit layers with zero points other than 128"):
        load_model(ckpt8)


def test_legacy_quantize_config_json_is_read(tiny_checkpoint, tmp_path):
    ckpt = make(tiny_checkpoint, tmp_path / "gptq", bits=8, group=32)
    raw = json.loads((ckpt / "config.json").read_text())
    (ckpt / "quantize_config.json").write_text(json.dumps(raw.pop("quantization_config")))
    (ckpt / "config.json").write_text(json.dumps(raw))
    model = load_model(ckpt)
    assert model.layers[0].self_attn.o_proj.mode == "int8"
    shutil.rmtree(ckpt)


@pytest.mark.parametrize("fmt,word", [("gptq", 0x77777777), ("gptq_v2", 0x88888888 - (1 << 32))])
def test_symmetric_4_bit_zero_points_are_stored_as_autogptq_does(tiny_checkpoint, tmp_path, fmt, word):
    """AutoGPTQ's v1 format stores zero - 1 (7 for the symmetric zero 8, eight nibbles a word); v2 the zero."""
    ckpt = make(tiny_checkpoint, tmp_path / "gptq", bits=4, group=32, fmt=fmt)
    qzeros = load_file(str(ckpt / "model.safetensors"))["model.layers.0.self_attn.q_proj.qzeros"]
    assert (qzeros == word).all()
    assert load_model(ckpt).layers[0].self_attn.qkv_proj.zeros is None      # read back as the symmetric 8
