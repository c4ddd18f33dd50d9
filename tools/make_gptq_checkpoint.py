"""Write a GPTQ-format checkpoint (AutoGPTQ's layout, ``checkpoint_format`` "gptq") from an HF Llama folder,
or with ``--awq`` an AWQ one (AutoAWQ's GEMM layout: 4 bits, zero points, packed along the output).

    .venv/bin/python -m tools.make_gptq_checkpoint SRC OUT [--bits 4] [--group 128] [--asym] [--format gptq]
    .venv/bin/python -m tools.make_gptq_checkpoint SRC OUT --awq [--group 128]

Each decoder projection is quantized by round-to-nearest on GPTQ's grid (this writes the format, it does
not run GPTQ's error-compensating solver): symmetric ``scale = 2 max|w| / (2^bits - 1)``, zero
``2^(bits - 1)``; asymmetric ``scale = (max - min) / (2^bits - 1)``, ``zero = round(-min / scale)``,
``n = clamp(round(w / scale) + zero, 0, 2^bits - 1)``, per group of input columns. Tensors: ``qweight``,
``qzeros`` (stored minus one in the v1 "gptq" format), ``scales`` fp16 and ``g_idx``; the embedding,
norms and LM head stay in full precision. Packing is ``backend/model/gptq.py``'s (no auto-gptq needed).
"""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from backend.model.awq import pack_awq
from backend.model.config import ModelConfig
from backend.model.gptq import FORMATS
from backend.model.prequantized import pack_cols, pack_rows
from backend.model.loader import read_hf_tensors


def gptq_round_to_nearest(w: torch.Tensor, bits: int, group: int, sym: bool
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """w [out, in] -> (n [in, out] in [0, 2^bits), zeros [groups, out], scales fp16 [groups, out])."""
    maxq = (1 << bits) - 1
    out_f, in_f = w.shape
    g = w.float().reshape(out_f, in_f // group, group)
    if sym:
        scale = (2 * g.abs().amax(2) / maxq).clamp(min=1e-8)
        zero = torch.full_like(scale, (maxq + 1) // 2)
    else:
        lo, hi = g.amin(2).clamp(max=0), g.amax(2).clamp(min=0)
        scale = ((hi - lo) / maxq).clamp(min=1e-8)
        zero = torch.round(-lo / scale).clamp(0, maxq)
    scale = scale.half().float()                                   # the stored precision
    n = torch.clamp(torch.round(g / scale[:, :, None]) + zero[:, :, None], 0, maxq)
    return n.reshape(out_f, in_f).t().to(torch.int32), zero.t().to(torch.int32), scale.t().half()


def make(src: Path, out: Path, *, bits: int = 4, group: int = 128, sym: bool = True, fmt: str = "gptq",
         awq: bool = False) -> Path:
    """``awq``: AutoAWQ's GEMM layout instead (4 bits, zero points; ``sym``/``fmt`` do not apply)."""
    raw = json.loads((src / "config.json").read_text())
    cfg = ModelConfig.from_dict(raw, str(src / "config.json"))
    hf = read_hf_tensors(src, cfg)
    tensors: dict[str, torch.Tensor] = {}
    for name, t in hf.items():
        if not (name.endswith("_proj.weight") and name.startswith("model.layers.")):
            tensors[name] = t.contiguous()
            continue
        g = t.shape[1] if group == -1 else group
        base = name[:-len("weight")]
        if awq:      # AWQ's grid is the asymmetric one; packed along the output in its interleaved order
            n, zero, scale = gptq_round_to_nearest(t, 4, g, False)
            tensors.update({base + "qweight": pack_awq(n), base + "qzeros": pack_awq(zero),
                            base + "scales": scale.contiguous()})
            continue
        n, zero, scale = gptq_round_to_nearest(t, bits, g, sym)
        tensors[base + "qweight"] = pack_rows(n, bits)
        tensors[base + "qzeros"] = pack_cols(zero - FORMATS[fmt], bits)
        tensors[base + "scales"] = scale.contiguous()
        tensors[base + "g_idx"] = (torch.arange(t.shape[1]) // g).to(torch.int32)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    raw["quantization_config"] = ({"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True,
                                   "version": "gemm"} if awq else
                                  {"quant_method": "gptq", "bits": bits, "group_size": group, "sym": sym,
                                   "desc_act": False, "checkpoint_format": fmt})
    (out / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
    for f in src.iterdir():
        if f.is_file() and f.name != "config.json" and not f.name.startswith("model"):   # tokenizer, generation
            shutil.copy(f, out / f.name)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--bits", type=int, choices=(4, 8), default=4)
    ap.add_argument("--group", type=int, default=128, help="input columns per scale; -1: one per output row")
    ap.add_argument("--asym", action="store_true", help="zero points per group (sym false)")
    ap.add_argument("--format", choices=tuple(FORMATS), default="gptq")
    ap.add_argument("--awq", action="store_true", help="write AutoAWQ's GEMM format instead (4 bits, zero points)")
    args = ap.parse_args(argv)
    print(make(args.src, args.out, bits=args.bits, group=args.group, sym=not args.asym, fmt=args.format,
               awq=args.awq))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
