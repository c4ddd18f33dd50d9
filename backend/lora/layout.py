"""Where a family's PEFT target modules sit in the engine's fused projections.

PEFT names a target by the checkpoint's module (``model.layers.{i}.self_attn.q_proj``), so a family's targets are
the projections its checkpoint stores, as its ``Architecture`` declares them: split q/k/v and gate/up (Llama,
Mistral, Qwen2, Qwen3: ``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``, ``gate_proj``, ``up_proj``, ``down_proj``) or
fused (Phi-3: ``qkv_proj``, ``o_proj``, ``gate_up_proj``, ``down_proj``). Inside the engine every layer has four
projections, ``qkv`` (q | k | v), ``o``, ``gate_up`` (gate | up) and ``down``; each target module is a block of
output rows of one of them: Llama's ``k_proj`` the k rows of ``qkv``, Phi-3's ``qkv_proj`` all of them.
"""
from __future__ import annotations

from backend.model.config import ModelConfig

PROJECTIONS = ("qkv", "o", "gate_up", "down")   # the model's (and the native op's) order
ATTENTION_MODULES = frozenset({"q_proj", "k_proj", "v_proj", "qkv_proj", "o_proj"})   # under self_attn; else mlp

Layout = dict[str, tuple[int, int, list[tuple[str, int, int]]]]


def projection_layout(cfg: ModelConfig) -> Layout:
    """Per fused projection: (N, K, [(PEFT module, first output row, rows)]), the modules in stacking order."""
    arch = cfg.architecture
    d, q, kv, i = cfg.hidden_size, cfg.num_attention_heads * cfg.head_dim, \
        cfg.num_key_value_heads * cfg.head_dim, cfg.intermediate_size
    parts = {"qkv": (d, arch.qkv_rows(q, kv)), "o": (q, (("self_attn.o_proj", d),)),
             "gate_up": (d, arch.gate_up_rows(i)), "down": (i, (("mlp.down_proj", d),))}
    layout: Layout = {}
    for p in PROJECTIONS:
        k, named_rows = parts[p]
        row0, modules = 0, []
        for name, rows in named_rows:
            modules.append((name.rsplit(".", 1)[1], row0, rows))
            row0 += rows
        layout[p] = (row0, k, modules)
    return layout


def module_shapes(cfg: ModelConfig) -> dict[str, tuple[int, int]]:
    """(out, in) of each PEFT target module of one decoder layer of this family."""
    return {m: (rows, k) for _, k, modules in projection_layout(cfg).values() for m, _, rows in modules}


def module_key(layer: int, module: str) -> str:
    """PEFT's name of a target module (what ``rank_pattern`` / ``alpha_pattern`` keys match)."""
    return f"model.layers.{layer}.{'self_attn' if module in ATTENTION_MODULES else 'mlp'}.{module}"
