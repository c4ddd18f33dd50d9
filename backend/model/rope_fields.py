"""The RoPE fields of ``config.json`` as each family's config class reads them: ``rope_theta``, ``rope_scaling`` /
``rope_parameters`` (its type, renamed as the class does; LongRoPE's factors checked), ``partial_rotary_factor``, and
Gemma 3's RoPE per layer type (``rope_local_base_freq``). ``ModelConfig.from_dict`` (config.py) calls them."""
from __future__ import annotations

from backend.model.architecture import LAYER_TYPES, Architecture
from backend.model.checkpoint_error import CheckpointError


def read_rope(d: dict, arch: Architecture, head_dim: int, source: str) -> tuple[float, tuple | None, int]:
    """``(rope_theta, rope_scaling items or None, rotary dims)`` as the family's config class reads them."""
    # transformers >= 5 writes "rope_parameters" (with rope_theta inside) instead of "rope_scaling"
    rope_scaling = dict(d.get("rope_scaling") or d.get("rope_parameters") or {})
    rope_theta = d.get("rope_theta") or rope_scaling.get("rope_theta") or 10000.0
    prf = rope_scaling.get("partial_rotary_factor", d.get("partial_rotary_factor", 1.0))
    if prf is None:
        prf = 1.0
    if isinstance(prf, bool) or not isinstance(prf, (int, float)) or not 0 < prf <= 1:
        raise CheckpointError(f"{source}: partial_rotary_factor must be a number in (0, 1], got {prf!r}")
    if prf != 1 and not arch.partial_rotary:
        raise CheckpointError(f"{source}: partial_rotary_factor {prf!r} is not supported by the {arch.family} "
                              "layout (RoPE on the whole head)")
    rotary_dim = int(head_dim * prf)
    if rotary_dim % 2:
        raise CheckpointError(f"{source}: partial_rotary_factor {prf!r} gives an odd rotary dimension {rotary_dim}")
    rtype = rope_scaling.get("rope_type", rope_scaling.get("type", "default"))
    rtype = dict(arch.rope_aliases).get(rtype, rtype)
    if rtype in (None, "default"):
        return rope_theta, None, rotary_dim
    if rtype not in arch.rope_types:
        raise CheckpointError(f"{source}: unknown rope type {rtype!r} in rope_scaling; supported for "
                              f"{arch.hf_class}: {arch.rope_types}")
    rope_scaling["rope_type"] = rtype
    rope_scaling.pop("type", None)
    if rtype == "longrope":
        check_longrope(d, rope_scaling, rotary_dim, source)
    items = tuple(sorted((k, tuple(v) if isinstance(v, list) else v)
                         for k, v in rope_scaling.items() if k not in ("rope_theta", "partial_rotary_factor")))
    return rope_theta, items, rotary_dim


def read_layer_type_ropes(d: dict, arch: Architecture, head_dim: int, source: str):
    """Gemma 3's two RoPEs, as its config class reads them: ``rope_parameters`` keyed by layer type
    (``full_attention``, ``sliding_attention``; transformers 5), else the flat fields (``rope_theta``, 1e6 by
    default, with ``rope_scaling`` for the full-attention layers; ``rope_local_base_freq``, 1e4, for the sliding
    ones). Returns ``read_rope``'s triple for each: (full, sliding)."""
    params = d.get("rope_parameters")
    if params is not None:
        if not isinstance(params, dict) or not set(params) <= set(LAYER_TYPES):
            raise CheckpointError(f"{source}: rope_parameters of a {arch.hf_class} must be keyed by layer type "
                                  f"{LAYER_TYPES}, got {params!r}")
        full = dict(params.get("full_attention") or {})
        local = dict(params.get("sliding_attention") or {})
    else:
        full = {"rope_type": "default", **(d.get("rope_scaling") or {})}
        local = {"rope_type": "default"}
    full.setdefault("rope_theta", d.get("rope_theta") or 1_000_000.0)
    local.setdefault("rope_theta", d.get("rope_local_base_freq") or 10_000.0)
    return tuple(read_rope({"rope_parameters": r}, arch, head_dim, f"{source} ({kind} layers)")
                 for r, kind in ((full, "full_attention"), (local, "sliding_attention")))


def check_longrope(d: dict, rs: dict, rotary_dim: int, source: str) -> None:
    """LongRoPE's fields, checked; ``original_max_position_embeddings`` resolved into ``rs`` as transformers does
    (the top-level field first: Phi-3's config class has it, 4096 by default)."""
    orig = d.get("original_max_position_embeddings") or rs.get("original_max_position_embeddings") \
        or d.get("max_position_embeddings")
    if isinstance(orig, bool) or not isinstance(orig, int) or orig <= 0:
        raise CheckpointError(f"{source}: original_max_position_embeddings must be a positive integer, got {orig!r}")
    rs["original_max_position_embeddings"] = orig
    for key in ("short_factor", "long_factor"):
        v = rs.get(key)
        if not isinstance(v, list) or len(v) != rotary_dim // 2 or \
                any(isinstance(x, bool) or not isinstance(x, (int, float)) or x <= 0 for x in v):
            raise CheckpointError(f"{source}: rope_scaling {key} must list {rotary_dim // 2} positive numbers "
                                  f"(one per rotated pair), got {v!r}")
    for key in ("factor", "attention_factor"):
        v = rs.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0):
            raise CheckpointError(f"{source}: rope_scaling {key} must be a positive number, got {v!r}")
