"""Rotary position embeddings and the HF ``rope_scaling`` variants.

Each variant is a pure function from the config to ``(inv_freq, attention_scaling)``:
``inv_freq`` is ``[rotary_dim // 2]`` (``rotary_dim``: the head's leading dims RoPE rotates, all of it unless
``partial_rotary_factor`` < 1) and ``attention_scaling`` multiplies cos/sin (yarn, longrope).
"""
from __future__ import annotations

import dataclasses
import math

import torch

from backend.model.config import ModelConfig


def default_inv_freq(base: float, dim: int) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def linear_inv_freq(base: float, dim: int, factor: float) -> torch.Tensor:
    return default_inv_freq(base, dim) / factor


def dynamic_ntk_inv_freq(base: float, dim: int, factor: float, max_pos: int, seq_len: int) -> torch.Tensor:
    """Dynamic NTK: grow the base once sequences exceed the trained length.

    HF recomputes this per forward from the current length; a paged engine caches K
    across steps, so (as vLLM does) we fix ``seq_len`` at the scaled maximum.
    """
    if seq_len > max_pos:
        base = base * ((factor * seq_len / max_pos) - (factor - 1)) ** (dim / (dim - 2))
    return default_inv_freq(base, dim)


def llama3_inv_freq(base: float, dim: int, factor: float, low_freq_factor: float,
                    high_freq_factor: float, original_max: int) -> torch.Tensor:
    inv_freq = default_inv_freq(base, dim)
    low_wavelen = original_max / low_freq_factor
    high_wavelen = original_max / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (original_max / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


def yarn_inv_freq(base: float, dim: int, factor: float, original_max: int, beta_fast: float = 32.0,
                  beta_slow: float = 1.0, mscale: float | None = None,
                  mscale_all_dim: float | None = None) -> tuple[torch.Tensor, float]:
    def get_mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if mscale and mscale_all_dim:
        attention_factor = get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)
    else:
        attention_factor = get_mscale(factor)

    def correction_dim(num_rot: float) -> float:
        return (dim * math.log(original_max / (num_rot * 2 * math.pi))) / (2 * math.log(base))

    low = max(math.floor(correction_dim(beta_fast)), 0)
    high = min(math.ceil(correction_dim(beta_slow)), dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    extrapolation = 1.0 / pos_freqs
    interpolation = 1.0 / (factor * pos_freqs)
    extrapolation_factor = 1 - ramp
    inv_freq = interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor
    return inv_freq, attention_factor


def longrope_inv_freq(base: float, dim: int, ext_factors: list[float]) -> torch.Tensor:
    """LongRoPE (Phi-3): each frequency divided by its own factor (``short_factor`` or ``long_factor``)."""
    ext = torch.tensor(ext_factors, dtype=torch.float32)
    return 1.0 / (ext * base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def longrope_attention_factor(factor: float | None, attention_factor: float | None, max_pos: int,
                              original_max: int) -> float:
    """cos/sin scale of LongRoPE as transformers computes it: ``attention_factor`` if set, else from ``factor``
    (default ``max_position_embeddings / original_max_position_embeddings``)."""
    if attention_factor is not None:
        return float(attention_factor)
    factor = max_pos / original_max if factor is None else factor
    return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original_max))


def rope_parameters(cfg: ModelConfig, long: bool = False, local: bool = False) -> tuple[torch.Tensor, float]:
    """``(inv_freq [rotary_dim // 2], attention_scaling)`` for the config's rope type. LongRoPE: the short
    factors (what transformers uses while a sequence stays within ``original_max_position_embeddings``: the
    engine serves no more, ``ModelConfig.exact_positions``), ``long``: the long ones. ``local``: the sliding layers'
    own RoPE (``ModelConfig.local_rope_theta``, Gemma 3)."""
    if local:
        cfg = dataclasses.replace(cfg, rope_theta=cfg.local_rope_theta, rope_scaling=cfg.local_rope_scaling,
                                  local_rope_theta=None, local_rope_scaling=None)
    dim, base = cfg.rope_dim, cfg.rope_theta
    rs = cfg.rope_scaling_dict or {}
    rtype = cfg.rope_type
    if rtype == "default":
        return default_inv_freq(base, dim), 1.0
    factor = float(rs.get("factor", 1.0))
    if rtype == "linear":
        return linear_inv_freq(base, dim, factor), 1.0
    if rtype == "dynamic":
        max_pos = cfg.max_position_embeddings
        return dynamic_ntk_inv_freq(base, dim, factor, max_pos, int(max_pos * factor)), 1.0
    original_max = int(rs.get("original_max_position_embeddings", cfg.max_position_embeddings))
    if rtype == "llama3":
        return llama3_inv_freq(base, dim, factor, float(rs.get("low_freq_factor", 1.0)),
                               float(rs.get("high_freq_factor", 4.0)), original_max), 1.0
    if rtype == "yarn":
        inv, att = yarn_inv_freq(base, dim, factor, original_max, float(rs.get("beta_fast", 32.0)),
                                 float(rs.get("beta_slow", 1.0)), rs.get("mscale"), rs.get("mscale_all_dim"))
        if rs.get("attention_factor") is not None:
            att = float(rs["attention_factor"])
        return inv, att
    if rtype == "longrope":
        att = longrope_attention_factor(rs.get("factor"), rs.get("attention_factor"), cfg.max_position_embeddings,
                                        original_max)
        return longrope_inv_freq(base, dim, list(rs["long_factor" if long else "short_factor"])), att
    raise ValueError(f"unknown rope type {rtype!r}")


def rope_cos_sin(inv_freq: torch.Tensor, attention_scaling: float, max_positions: int,
                 dtype: torch.dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Tables ``cos, sin`` of shape ``[max_positions, rotary_dim]`` (HF's rotate-half layout)."""
    t = torch.arange(max_positions, dtype=torch.float32)
    freqs = torch.outer(t, inv_freq.float())
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * attention_scaling).to(dtype=dtype, device=device), \
           (emb.sin() * attention_scaling).to(dtype=dtype, device=device)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``[num_tokens, num_heads, head_dim]`` by per-token ``cos, sin`` ``[num_tokens, 1, rotary_dim]``:
    the first ``rotary_dim`` dims of each head (all of them unless the rotary is partial), the rest unchanged."""
    rd = cos.shape[-1]
    if rd != x.shape[-1]:
        return torch.cat((apply_rope(x[..., :rd], cos, sin), x[..., rd:]), dim=-1)
    half = rd // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
