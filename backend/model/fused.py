"""Fused elementwise ops for the forward on CUDA (``backend/model/fused_kernels.py``), and when they run.

``LlamaForCausalLM.fused`` is None (every op in torch, the CPU's case) or a ``FusedOps``: the builder sets it
on CUDA once ``fused_ops`` has run each kernel on small inputs against its torch reference below, so a kernel
that fails to compile or disagrees on this GPU leaves the torch path in place, with the reason in the load line.
``TRITON_LLM_FUSED=0`` turns them off.

The references are the model's own torch ops (``rms_norm``, ``apply_rope``, ``silu(gate) * up``), written as
the fused signature: ``add_rms_norm(x, residual, weight, eps) -> (normed, new residual)``.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from backend.model.llama import rms_norm
from backend.model.rope import apply_rope


def add_rms_norm_reference(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                           eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """x, residual [rows, cols] -> (rms_norm(x + residual), x + residual); without a residual, of x."""
    s = x if residual is None else residual + x
    return rms_norm(s, weight, eps), s


def silu_mul_reference(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [rows, 2 * cols] -> silu(gate) * up [rows, cols]."""
    gate, up = gate_up.split(gate_up.shape[-1] // 2, dim=-1)
    return F.silu(gate) * up


@dataclass(frozen=True)
class FusedOps:
    add_rms_norm: Callable    # (x, residual | None, weight, eps) -> (normed, new residual)
    silu_mul: Callable        # gate_up -> silu(gate) * up
    rope: Callable            # (x, cos, sin) -> rotated x


TORCH_OPS = FusedOps(add_rms_norm_reference, silu_mul_reference, apply_rope)


def check_against_reference(ops: FusedOps, device: torch.device, dtype: torch.dtype, head_dim: int) -> str:
    """Run each op of ``ops`` on small random inputs and compare with torch; "" when all agree, else why not."""
    gen = torch.Generator(device="cpu").manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)

    tol = {"atol": 1e-4, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    x, res, w = rand(3, 96), rand(3, 96), rand(96)
    qkv = rand(3, 7, head_dim)
    cos, sin = rand(3, 1, head_dim), rand(3, 1, head_dim)
    gate_up = rand(3, 2 * 80)
    cases = {
        "add_rms_norm": (lambda o: o.add_rms_norm(x, res, w, 1e-5)),
        "rms_norm": (lambda o: o.add_rms_norm(x, None, w, 1e-5)),
        "silu_mul": (lambda o: o.silu_mul(gate_up)),
        "rope": (lambda o: o.rope(qkv[:, :5], cos, sin)),     # q and k: a strided view, as in the model
    }
    for name, run in cases.items():
        try:
            got, want = run(ops), run(TORCH_OPS)
        except Exception as exc:  # a kernel that does not compile or launch here
            return f"{name} failed ({type(exc).__name__}: {str(exc).strip().splitlines()[0][:200] if str(exc) else ''})"
        for g, e in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
            if g.shape != e.shape or not torch.allclose(g.float(), e.float(), **tol):
                return f"{name} disagrees with torch (max |diff| {(g.float() - e.float()).abs().max().item():.3g})"
    return ""


def fused_ops(device: torch.device, dtype: torch.dtype, head_dim: int) -> tuple[FusedOps | None, str]:
    """The Triton ops for a CUDA model, or None and why not."""
    if os.environ.get("TRITON_LLM_FUSED", "1") == "0":
        return None, "off (TRITON_LLM_FUSED=0)"
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return None, "CUDA only"
    from backend.model import fused_kernels as k
    ops = FusedOps(k.add_rms_norm, k.silu_mul, k.rope)
    reason = check_against_reference(ops, device, dtype, head_dim)
    return (None, reason) if reason else (ops, "on")
