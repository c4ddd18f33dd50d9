"""The fast step on the CPU: the whole forward of any step (decode, verify, prefill, mixed) in one native op.

``torch.ops.triton_llm.decode_forward`` (``backend/native/csrc/decode_forward.cpp``) runs every layer
(RMSNorm fused with the residual add, QKV, RoPE, paged K/V write, GQA paged attention over the block
table, o-proj, gate-up, SiLU * up, down) and the LM head with no Python and no op dispatch between
them; its inputs come from the persistent buffers of ``PersistentDecodeBatch``. A step with prefill chunks
asks the op for the sampled tokens' logits alone (``logit_rows``), which also lets those tokens alone go
through the last layer past its K/V write: a 300-token prefill runs ~1.7x faster than the eager forward
(docs/benchmarks.md). Prefill steps stay eager where the op's attention has no tiled kernel for the head
dim (``TILED_HEAD_DIMS``): its per-token loop is no faster than the eager forward at 300 tokens (head dim
24: 62 against 64 us per token) and grows with the square of the prompt. Models the op does not cover stay
eager: ``unsupported_reason`` says which and why (the load line shows it). At build the model's weights move
onto transparent huge pages (``huge_pages.py``; a batch-1 step streams all of them), where the kernel allows,
and the projections' weights are packed into the op's panels (``pack_panels``: a second copy, in the op's layout).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
from torch import nn

from backend.core.kv_cache import KVCache
from backend.core.plan import ForwardOutput, SchedulerOutput
from backend.engine.decode_batch import PersistentDecodeBatch, decode_step_shape, eager_only_reason
from backend.engine.huge_pages import MIN_PANEL_HUGE_PAGE_BYTES, HugePageResult, copy_to_huge_pages, move_to_huge_pages
from backend.model.llama import LlamaForCausalLM


def unsupported_reason(model: LlamaForCausalLM, kv_cache: KVCache, windows, scale: float | None) -> str | None:
    """Why the native step cannot serve this model (None: it can)."""
    if kv_cache.device.type != "cpu":
        return f"the native step runs on the CPU (the cache is on {kv_cache.device})"
    if kv_cache.dtype != torch.float32 or model.embed_tokens.weight.dtype != torch.float32:
        return "the native step needs float32 weights and KV cache"
    if reason := eager_only_reason(model, kv_cache, windows):
        return reason
    if any(layer.self_attn.o_proj.bias is not None for layer in model.layers):
        return "an o_proj bias is not supported"
    if type(model.lm_head) is not nn.Linear or model.lm_head.bias is not None:
        return "a quantized or biased LM head runs eagerly"
    return None


@dataclass(frozen=True)
class NativeWeights:
    """The op's weight arguments, listed once (row-major tensors share the model's storage; the panels are the
    projections' weights packed for the op's GEMV, a copy: ``pack_panels``)."""

    embed: torch.Tensor                 # [vocab, hidden]
    layer_weights: list[torch.Tensor]   # per layer: input_norm, qkv, o, post_norm, gate_up, down
    layer_biases: list[torch.Tensor]    # per layer: qkv, gate_up, down (an empty tensor: no bias)
    layer_panels: list[torch.Tensor]    # per layer: qkv, o, gate_up, down, each [ceil(out / 64), in, 64]
    cos: torch.Tensor                   # [max_positions, head_dim]
    sin: torch.Tensor                   # [max_positions, head_dim]
    final_norm: torch.Tensor            # [hidden]
    lm_head: torch.Tensor               # [vocab, hidden]
    lm_head_panels: torch.Tensor        # [ceil(vocab / 64), hidden, 64]

    @classmethod
    def of(cls, ops, model: LlamaForCausalLM) -> NativeWeights:
        none = torch.empty(0)
        bias = lambda lin: none if lin.bias is None else lin.bias.detach().contiguous()
        weights, biases, projections = [], [], []
        for layer in model.layers:
            a, m = layer.self_attn, layer.mlp
            weights += [t.detach().contiguous() for t in (layer.input_layernorm.weight, a.qkv_proj.weight,
                        a.o_proj.weight, layer.post_attention_layernorm.weight, m.gate_up_proj.weight,
                        m.down_proj.weight)]
            biases += [bias(a.qkv_proj), bias(m.gate_up_proj), bias(m.down_proj)]
            projections += weights[-5:-3] + weights[-2:]
        lm_head = model.lm_head.weight.detach()
        panels = pack_panels(ops, projections + [lm_head])
        cos, sin = model.rope_tables()
        return cls(model.embed_tokens.weight.detach(), weights, biases, panels[:-1], cos.contiguous(),
                   sin.contiguous(), model.norm.weight.detach(), lm_head, panels[-1])


def pack_panels(ops, weights: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each weight ``[out, in]`` packed into its panels (``ops.pack_panels``, backend/native/csrc/f32_gemv.h), all of
    them in one huge-page arena once they fill a huge page (``huge_pages.py``: a batch-1 step streams them all)."""
    packed = [ops.pack_panels(w) for w in weights]
    if sum(p.numel() for p in packed) * 4 < MIN_PANEL_HUGE_PAGE_BYTES:
        return packed
    return copy_to_huge_pages(packed) or packed


TILED_HEAD_DIMS = range(16, 129, 16)   # the op's tiled attention (paged_attention.cpp, kMaxD16); else a per-token loop


class NativeDecodeStep:
    """Runs every step through ``decode_forward``; ``build_seconds`` is the load time it added."""

    def __init__(self, ops, model: LlamaForCausalLM, kv_cache: KVCache, scale: float | None,
                 build_seconds: float = 0.0, huge_pages: HugePageResult | None = None):
        cfg = model.config
        self.huge_pages = huge_pages   # where the weights went (None: not moved by build)
        self._op = ops.decode_forward
        self.weights = NativeWeights.of(ops, model)
        self.k_cache, self.v_cache = list(kv_cache.k), list(kv_cache.v)
        self.block_size = kv_cache.block_size
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, \
            cfg.head_dim
        self.eps = float(cfg.rms_norm_eps)
        self.scale = float(scale) if scale is not None else 1.0 / math.sqrt(cfg.head_dim)
        self.batch = PersistentDecodeBatch(kv_cache.block_size)
        self.build_seconds = build_seconds
        self.prefills = cfg.head_dim in TILED_HEAD_DIMS   # prefill chunks too, or decode and verify steps only

    @classmethod
    def build(cls, model: LlamaForCausalLM, kv_cache: KVCache, windows, scale: float | None
              ) -> NativeDecodeStep | str:
        """The step, or why not (the model is unsupported, or the native library is unavailable)."""
        reason = unsupported_reason(model, kv_cache, windows, scale)
        if reason is not None:
            return reason
        from backend.native import native_ops
        t0 = time.perf_counter()
        build = native_ops()
        if not build.available:
            return build.reason
        if not hasattr(build.ops, "decode_forward"):
            return "the native library has no decode_forward op"
        pages = move_to_huge_pages(model)
        step = cls(build.ops, model, kv_cache, scale, huge_pages=pages)   # packs the panels
        step.build_seconds = time.perf_counter() - t0
        return step

    def accepts(self, plan: SchedulerOutput) -> bool:
        """Decode and verify steps; prefill chunks and their mixes too where the attention is tiled (``prefills``)."""
        return plan.num_batched_tokens > 0 and (self.prefills or decode_step_shape(plan))

    def run(self, plan: SchedulerOutput) -> ForwardOutput:
        """Logits of the step's sampled rows, ``[len(rows), vocab]`` (none when no sequence samples)."""
        inp = self.batch.prepare(plan)
        logits = self.forward(inp.token_ids, inp.positions, inp.token_rows, inp.block_tables, inp.logit_rows)
        return ForwardOutput(logits, inp.rows) if inp.rows else ForwardOutput(None, [])

    def forward(self, token_ids: torch.Tensor,      # [num_tokens] int64
                positions: torch.Tensor,            # [num_tokens] int64
                token_rows: torch.Tensor,           # [num_tokens] int32  block-table row of each token
                block_tables: torch.Tensor,         # [num_rows, width] int32
                logit_rows: torch.Tensor | None = None,   # [num_logits] int64 increasing token indices; None: all
                ) -> torch.Tensor:
        """Logits ``[num_tokens, vocab]`` (``[num_logits, vocab]``: those tokens'): each token at its position of its
        row's sequence, attending causally to that row's paged KV (also the draft model's steps:
        ``backend/spec_decode/draft_forward.py``)."""
        w = self.weights
        return self._op(token_ids, positions, token_rows, block_tables, self.block_size, w.embed, w.layer_weights,
                        w.layer_biases, w.layer_panels, self.k_cache, self.v_cache, w.cos, w.sin, w.final_norm,
                        w.lm_head, w.lm_head_panels, self.num_heads, self.num_kv_heads, self.head_dim, self.eps,
                        self.scale, logit_rows)
