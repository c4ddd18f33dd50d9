"""Launch-parameter helpers shared by the attention kernels (plain Python, no triton import)."""
from __future__ import annotations

import math

import torch

LOG2E = 1.4426950408889634
NO_WINDOW = 1 << 30   # the kernels' ``window`` argument for full causal attention (no position reaches it)


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def padded_dim(n: int, minimum: int = 16) -> int:
    """Smallest power of two >= max(n, minimum): ``tl.dot`` wants tiles of at least 16."""
    return max(minimum, next_pow2(n))


def softmax_scale_log2(head_dim: int, scale: float | None) -> float:
    """The softmax scale folded with log2(e), since the kernels use ``exp2``."""
    return (scale if scale is not None else 1.0 / math.sqrt(head_dim)) * LOG2E


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 inputs: full-precision dot (no TF32), so the fp32 path is a faithful reference."""
    return "ieee" if dtype == torch.float32 else "tf32"


def check_cache_layout(k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    """Both ``[num_blocks, block_size, num_kv_heads, head_dim]``, same strides, unit stride on head_dim."""
    if k_cache.shape != v_cache.shape or k_cache.stride() != v_cache.stride():
        raise ValueError("k_cache and v_cache must share shape and strides")
    if k_cache.dim() != 4 or k_cache.stride(-1) != 1:
        raise ValueError("cache must be [num_blocks, block_size, num_kv_heads, head_dim] with unit stride last")
    bs = k_cache.shape[1]
    if bs < 16 or bs & (bs - 1):
        raise ValueError(f"Triton attention needs a power-of-two block_size >= 16, got {bs}")


def window_arg(window: int | None) -> int:
    """The kernels' runtime ``window`` (keys ``p - window < k <= p``): ``NO_WINDOW`` when there is none."""
    if window is None:
        return NO_WINDOW
    if not 0 < window < NO_WINDOW:
        raise ValueError(f"sliding window must be in [1, {NO_WINDOW}), got {window}")
    return int(window)


def check_scales(k_cache: torch.Tensor, k_scale: torch.Tensor | None, v_scale: torch.Tensor | None) -> bool:
    """Whether the cache is quantized: 8-bit codes come with fp16 scales ``[num_blocks, block_size, kv_heads]``
    of matching strides; a float cache comes without."""
    quantized = k_cache.dtype in (torch.int8, torch.float8_e4m3fn)
    if not quantized:
        if k_scale is not None or v_scale is not None:
            raise ValueError(f"a {k_cache.dtype} KV cache takes no scales")
        return False
    if k_scale is None or v_scale is None:
        raise ValueError(f"a {k_cache.dtype} KV cache needs k_scale and v_scale")
    if k_scale.shape != k_cache.shape[:3] or k_scale.stride() != v_scale.stride() or k_scale.stride(-1) != 1 \
            or k_scale.dtype != torch.float16:
        raise ValueError("KV scales must be fp16 [num_blocks, block_size, num_kv_heads] with unit stride last")
    return True
