"""The LoRA delta on CUDA as two Triton kernels (Punica's BGMV): each token's shrink through its slot's ``A``,
then the expand through its ``B`` added into the projection's output; tokens of slot -1 are skipped.

``shrink``: grid (tokens, rank blocks), ``mid[t, r] = sum_k A[s, r, k] x[t, k]`` in fp32; ``expand``: grid
(tokens, output blocks), ``y[t, n] += sum_r B[s, n, r] mid[t, r]`` (rounded once to ``y``'s dtype). Tested
under ``TRITON_INTERPRET=1`` against ``lora_delta_reference`` (tests/backend/lora/triton_delta_cases.py);
``LoraBatch`` runs them on CUDA once ``triton_delta_matches`` has checked them there, else its torch segments.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _shrink_kernel(mid_ptr, x_ptr, a_ptr, slots_ptr, K, R, x_stride,
                   BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    t = tl.program_id(0)
    s = tl.load(slots_ptr + t)
    if s >= 0:
        r = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
        acc = tl.zeros((BLOCK_R,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            x = tl.load(x_ptr + t * x_stride + k, mask=k < K, other=0.0).to(tl.float32)
            a = tl.load(a_ptr + (s * R + r[:, None]) * K + k[None, :], mask=(r[:, None] < R) & (k[None, :] < K),
                        other=0.0).to(tl.float32)
            acc += tl.sum(a * x[None, :], axis=1)
        tl.store(mid_ptr + t * R + r, acc, mask=r < R)


@triton.jit
def _expand_kernel(y_ptr, mid_ptr, b_ptr, slots_ptr, N, R, y_stride,
                   BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr):
    t = tl.program_id(0)
    s = tl.load(slots_ptr + t)
    if s >= 0:
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        r = tl.arange(0, BLOCK_R)
        m = tl.load(mid_ptr + t * R + r, mask=r < R, other=0.0)
        b = tl.load(b_ptr + (s * N + n[:, None]) * R + r[None, :], mask=(n[:, None] < N) & (r[None, :] < R),
                    other=0.0).to(tl.float32)
        y = tl.load(y_ptr + t * y_stride + n, mask=n < N, other=0.0)
        out = y.to(tl.float32) + tl.sum(b * m[None, :], axis=1)
        tl.store(y_ptr + t * y_stride + n, out.to(y.dtype), mask=n < N)


def triton_lora_delta(x: torch.Tensor,       # [T, K] (unit column stride)
                      y: torch.Tensor,       # [T, N] updated in place (unit column stride)
                      a: torch.Tensor,       # [S, R, K] contiguous
                      b: torch.Tensor,       # [S, N, R] contiguous
                      slots: torch.Tensor,   # [T] int32, -1: no adapter
                      ) -> None:
    t, k = x.shape
    n, r = y.shape[1], a.shape[1]
    mid = torch.empty(t, r, device=x.device, dtype=torch.float32)
    block_r = triton.next_power_of_2(r)
    _shrink_kernel[(t, 1)](mid, x, a, slots, k, r, x.stride(0), BLOCK_R=block_r, BLOCK_K=64)
    _expand_kernel[(t, triton.cdiv(n, 64))](y, mid, b, slots, n, r, y.stride(0), BLOCK_N=64, BLOCK_R=block_r)


def triton_delta_matches(device: torch.device, dtype: torch.dtype) -> bool:
    """The kernels against the token-by-token reference on ``device`` at a small mixed batch."""
    from backend.lora.delta import lora_delta_reference

    g = torch.Generator().manual_seed(0)
    x, a, b = torch.randn(5, 40, generator=g), torch.randn(3, 12, 40, generator=g), torch.randn(3, 24, 12, generator=g)
    slots = torch.tensor([1, -1, 0, 2, 1], dtype=torch.int32)
    y = torch.zeros(5, 24, dtype=dtype, device=device)
    triton_lora_delta(x.to(device, dtype), y, a.to(device, dtype), b.to(device, dtype), slots.to(device))
    expected = lora_delta_reference(x.to(dtype).float(), a.to(dtype).float(), b.to(dtype).float(), slots)
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    return torch.allclose(y.double().cpu(), expected, rtol=tol, atol=tol * 10)
