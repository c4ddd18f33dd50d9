"""Compiled Triton backend vs the torch backend on CUDA (run by test_triton_kernels on a GPU machine).

Run alone: python tests/gpu_attention_check.py (prints one line per case, exits 1 on any mismatch).
"""
import sys

import torch

from backend.attention.metadata import build_attention_metadata
from backend.attention.torch_paged import TorchPagedAttention
from backend.attention.triton_paged import TritonPagedAttention
from backend.core.kv_cache import KVCache


def main() -> int:
    torch.manual_seed(0)
    failures = 0
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        for heads, kvh, d, bs in ((32, 8, 128, 16), (8, 1, 64, 32), (12, 4, 80, 16), (4, 4, 128, 16)):
            for split, window in ((False, None), (True, None), (False, 100), (True, 100)):   # window: sliding
                num_blocks = 400
                caches = [KVCache(1, num_blocks, bs, kvh, d, dtype=dtype, device="cuda") for _ in range(2)]
                ref = TorchPagedAttention(caches[0], windows=(window,))
                tri = TritonPagedAttention(caches[1], split_k=split, partition_tokens=4 * bs, windows=(window,))
                perm = torch.randperm(num_blocks).tolist()
                lens = [(700, 1), (0, 300), (513, 17), (33, 4), (1000, 1)]
                tables, at = [], 0
                for c, q in lens:
                    n = -(-(c + q) // bs)
                    tables.append(perm[at:at + n])
                    at += n
                for computed, new in (([0] * 5, [c + q - 1 for c, q in lens]), ([c + q - 1 for c, q in lens], [1] * 5)):
                    md = build_attention_metadata(computed, new, tables, bs, device="cuda")
                    t = sum(new)
                    q = torch.randn(t, heads, d, device="cuda", dtype=dtype)
                    k = torch.randn(t, kvh, d, device="cuda", dtype=dtype)
                    v = torch.randn(t, kvh, d, device="cuda", dtype=dtype)
                    outs = []
                    for attn in (ref, tri):
                        attn.prepare(md)
                        outs.append(attn.forward(0, q, k, v).float())
                    err = (outs[0] - outs[1]).abs().max().item()
                    tol = 2e-2 if dtype == torch.bfloat16 else 5e-3
                    ok = err < tol
                    failures += not ok
                    print(f"{'ok ' if ok else 'BAD'} {dtype} h={heads} kvh={kvh} d={d} bs={bs} split={split} "
                          f"window={window} decode={md.is_pure_decode} max_err={err:.2e}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
