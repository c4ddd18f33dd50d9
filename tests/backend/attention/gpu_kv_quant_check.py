"""Compiled Triton kernels over int8 / fp8 KV caches against the torch backend on CUDA (run by test_kv_quant
on a GPU machine).

Run alone: python tests/backend/attention/gpu_kv_quant_check.py (one line per case, exits 1 on any mismatch).
Checks the write kernel's codes and scales against ``quantize_per_token_head`` (one code step of slack:
the GPU's fp32 division may differ from the CPU's in the last bit) and the attention outputs against the
torch backend over the same quantized cache, and against exact (unquantized) KV.
"""
import sys

import torch

from backend.attention.metadata import build_attention_metadata
from backend.attention.torch_paged import TorchPagedAttention
from backend.attention.triton_paged import TritonPagedAttention
from backend.core.kv_cache import KVCache
from backend.core.kv_quant import quantize_per_token_head


def layout(lens, bs, num_blocks):
    perm = torch.randperm(num_blocks).tolist()
    tables, at = [], 0
    for c, q in lens:
        n = -(-(c + q) // bs)
        tables.append(perm[at:at + n])
        at += n
    return tables


def main() -> int:
    torch.manual_seed(0)
    failures = 0
    for kv in ("int8", "fp8"):
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            for heads, kvh, d, bs in ((32, 8, 128, 16), (6, 2, 32, 16), (8, 1, 64, 32)):
                for split in (False, True):
                    caches = [KVCache(1, 300, bs, kvh, d, dtype=dtype, device="cuda", kv_cache_dtype=k)
                              for k in (kv, kv, "auto")]
                    ref = TorchPagedAttention(caches[0])
                    tri = TritonPagedAttention(caches[1], split_k=split, partition_tokens=4 * bs)
                    exact = TorchPagedAttention(caches[2])
                    lens = [(700, 1), (0, 300), (513, 17), (33, 4), (1000, 1)]
                    tables = layout(lens, bs, 300)
                    steps = (([0] * 5, [c + q - 1 for c, q in lens]), ([c + q - 1 for c, q in lens], [1] * 5))
                    for computed, new in steps:
                        md = build_attention_metadata(computed, new, tables, bs, device="cuda")
                        t = sum(new)
                        q = torch.randn(t, heads, d, device="cuda", dtype=dtype)
                        k = torch.randn(t, kvh, d, device="cuda", dtype=dtype)
                        v = torch.randn(t, kvh, d, device="cuda", dtype=dtype)
                        outs = []
                        for attn in (ref, tri, exact):
                            attn.prepare(md)
                            outs.append(attn.forward(0, q, k, v).float())
                        codes, scales = quantize_per_token_head(k, caches[0].format)
                        got = caches[1].k[0].view(-1, kvh, d)[md.slot_mapping].float()
                        code_err = ((got - codes.float()).abs() / (1 if kv == "int8" else codes.float().abs()
                                                                   .clamp_min(1) / 8)).max().item()
                        scale_ok = torch.equal(caches[1].k_scale[0].view(-1, kvh)[md.slot_mapping], scales)
                        err = (outs[0] - outs[1]).abs().max().item()
                        exact_err = (outs[1] - outs[2]).abs().max().item()
                        tol = 2e-2 if dtype == torch.bfloat16 else 5e-3
                        ok = err < tol and code_err <= 1.0 and scale_ok and exact_err < (0.05 if kv == "int8" else 0.2)
                        failures += not ok
                        print(f"{'ok ' if ok else 'BAD'} kv={kv} {dtype} h={heads} kvh={kvh} d={d} bs={bs} "
                              f"split={split} decode={md.is_pure_decode} vs_torch={err:.2e} code_err={code_err:.2f} "
                              f"scales_equal={scale_ok} vs_exact={exact_err:.2e}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
