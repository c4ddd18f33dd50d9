"""The fast step on the CPU: the whole forward of any step (decode, verify, prefill, mixed) in one native op.

``torch.ops.triton_llm.decode_forward`` (``backend/native/csrc/decode_forward.cpp``) runs every layer
(RMSNorm fused with the residual add, QKV, q/k norms where the family declares them, RoPE (partial too; the
layer's table), paged K/V write, GQA paged attention over the block table within the layer's sliding window, o-proj
(and Gemma's norms of the attention's and the MLP's outputs), gate-up, SiLU or GELU-tanh * up, down) and the LM head with no Python and no op dispatch between
them; its inputs come from the persistent buffers of ``PersistentDecodeBatch``. A step with prefill chunks
asks the op for the sampled tokens' logits alone (``logit_rows``), which also lets those tokens alone go
through the last layer past its K/V write: a 300-token prefill runs ~1.7x faster than the eager forward
(docs/benchmarks.md). Prefill steps stay eager where the op's attention has no tiled kernel for the head
dim (``TILED_HEAD_DIMS``): its per-token loop is no faster than the eager forward at 300 tokens (head dim
24: 62 against 64 us per token) and grows with the square of the prompt. Models the op does not cover stay
eager: ``unsupported_reason`` says which and why (the load line shows it). At build the model's weights move
onto transparent huge pages (``huge_pages.py``; a batch-1 step streams all of them), where the kernel allows,
and the fp32 projections' weights are packed into the op's panels (``pack_panels``: a second copy, in the op's
layout). int8 / int4 projections (``QuantLinear`` with the quantized GEMM's strips, ``backend/model/quant_strips.py``)
go to the op as their strips, every step and every token count (the quantized LM head too).
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass

import torch
from torch import nn

from backend.core.kv_cache import KVCache
from backend.core.plan import ForwardOutput, SchedulerOutput
from backend.engine.decode_batch import PersistentDecodeBatch, decode_step_shape, kv_format_reason
from backend.engine.huge_pages import MIN_PANEL_HUGE_PAGE_BYTES, HugePageResult, copy_to_huge_pages, move_to_huge_pages
from backend.lora.delta import LoraBatch
from backend.model.llama import LlamaForCausalLM
from backend.model.quant import QuantLinear


def unsupported_reason(model: LlamaForCausalLM, kv_cache: KVCache, windows, scale: float | None) -> str | None:
    """Why the native step cannot serve this model (None: it can)."""
    if kv_cache.device.type != "cpu":
        return f"the native step runs on the CPU (the cache is on {kv_cache.device})"
    if kv_cache.dtype != torch.float32 or model.embed_tokens.weight.dtype != torch.float32:
        return "the native step needs float32 weights and KV cache"
    if reason := kv_format_reason(kv_cache):
        return reason
    for layer in model.layers:
        for lin in projections(layer):
            if not op_layer(lin):
                return f"{type(lin).__name__} projections without the quantized GEMM's strips run eagerly"
    if not op_layer(model.lm_head) or model.lm_head.bias is not None:
        return "a biased LM head, or a quantized one without the GEMM's strips, runs eagerly"
    return None


def projections(layer: nn.Module) -> tuple[nn.Module, ...]:
    """A decoder layer's four projections, in the op's order: qkv, o, gate_up, down."""
    return (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj)


def op_layer(lin: nn.Module) -> bool:
    """The op computes this linear layer: fp32 (its panels) or quantized with the GEMM's strips."""
    return type(lin) is nn.Linear or (isinstance(lin, QuantLinear) and lin.strips is not None)


def op_tensors(lin: nn.Module) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(the op's row-major entry: the weight, or the quantized weight read for its rows; strips, scales, aux of a
    quantized layer, three empty tensors of an fp32 one)."""
    if isinstance(lin, QuantLinear):
        return lin.qweight, [lin.strips.strips, lin.strips.scales, lin.strips.aux]
    none = torch.empty(0)
    return lin.weight.detach().contiguous(), [none, none, none]


@dataclass(frozen=True)
class NativeWeights:
    """The op's weight arguments, listed once (row-major tensors share the model's storage; the panels are the
    projections' weights packed for the op's GEMV, a copy: ``pack_panels``)."""

    embed: torch.Tensor                 # [vocab, hidden]
    layer_weights: list[torch.Tensor]   # per layer: input_norm, qkv, o, mlp_norm, gate_up, down, q_norm, k_norm,
                                        # attn_out_norm, mlp_out_norm (q/k norms [head_dim]; empty tensors where the
                                        # family has none); each norm's scale (Gemma's 1 + w: RMSNorm.scale)
    layer_biases: list[torch.Tensor]    # per layer: qkv, o, gate_up, down (an empty tensor: no bias)
    layer_panels: list[torch.Tensor]    # per layer: qkv, o, gate_up, down, each [ceil(out / 64), in, 64] (empty: int)
    rope: list[torch.Tensor]            # cos, sin of each RoPE table, [max_positions, rotary_dim] each (RoPE on each
                                        # head's first rotary_dim dims); the model's, then the sliding layers' own
    final_norm: torch.Tensor            # [hidden]
    lm_head: torch.Tensor               # [vocab, hidden] (quantized: its int8 weight)
    lm_head_panels: torch.Tensor        # [ceil(vocab / 64), hidden, 64] (empty: quantized)
    layer_quant: list[torch.Tensor]     # per projection: strips, scales, aux (empty tensors: fp32); [] if none is
    lm_head_quant: list[torch.Tensor]   # the LM head's strips, scales, aux; [] when fp32

    @classmethod
    def of(cls, ops, model: LlamaForCausalLM) -> NativeWeights:
        none = torch.empty(0)
        bias = lambda lin: none if lin.bias is None else lin.bias.detach().contiguous()
        norm = lambda n: none if n is None else n.scale().contiguous()
        weights, biases, quant, fp32 = [], [], [], []
        for layer in model.layers:
            a, m = layer.self_attn, layer.mlp
            rows = [op_tensors(lin) for lin in projections(layer)]
            weights += [norm(layer.input_layernorm), rows[0][0], rows[1][0], norm(layer.mlp_norm), rows[2][0],
                        rows[3][0], norm(a.q_norm), norm(a.k_norm), *map(norm, layer.output_norms)]
            biases += [bias(a.qkv_proj), bias(a.o_proj), bias(m.gate_up_proj), bias(m.down_proj)]
            quant += [t for _, q in rows for t in q]
            fp32 += [type(lin) is nn.Linear for lin in projections(layer)]
        head, head_quant = op_tensors(model.lm_head)
        fp32.append(type(model.lm_head) is nn.Linear)
        dense = [w for w, is_fp32 in zip(weights_of(weights) + [head], fp32) if is_fp32]
        packed = iter(pack_panels(ops, dense))
        panels = [next(packed) if is_fp32 else none for is_fp32 in fp32]
        rope = [t.contiguous() for table in model.all_rope_tables() for t in table]
        return cls(model.embed_tokens.weight.detach(), weights, biases, panels[:-1], rope, norm(model.norm), head,
                   panels[-1],
                   quant if not all(fp32[:-1]) else [], head_quant if not fp32[-1] else [])


LAYER_WEIGHTS = 10  # the op's tensors a layer in ``layer_weights`` (decode_forward.cpp, kLayerWeights)
ACTIVATION_CODES = {"silu": 0, "gelu_tanh": 1}   # ModelConfig.activation -> the op's activation


def weights_of(layer_weights: list[torch.Tensor]) -> list[torch.Tensor]:
    """The projections' entries of the per-layer list (qkv, o, gate_up, down of each layer's eight)."""
    return [w for i, w in enumerate(layer_weights) if i % LAYER_WEIGHTS in (1, 2, 4, 5)]


def pack_panels(ops, weights: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each weight ``[out, in]`` packed into its panels (``ops.pack_panels``, backend/native/csrc/f32_gemv.h), all of
    them in one huge-page arena once they fill a huge page (``huge_pages.py``: a batch-1 step streams them all)."""
    packed = [ops.pack_panels(w) for w in weights]
    if not packed:
        return packed
    if sum(p.numel() for p in packed) * 4 < MIN_PANEL_HUGE_PAGE_BYTES:
        return packed
    return copy_to_huge_pages(packed) or packed


def strips_to_huge_pages(model: LlamaForCausalLM) -> bool:
    """Move the quantized layers' GEMM strips into one huge-page arena once they fill a huge page (a batch-1 step
    streams them all, as the fp32 panels); True when moved."""
    lins = [lin for lin in model.modules() if isinstance(lin, QuantLinear) and lin.strips is not None]
    tensors = [t for lin in lins for t in (lin.strips.strips, lin.strips.scales, lin.strips.aux)]
    if not tensors or sum(t.numel() * t.element_size() for t in tensors) < MIN_PANEL_HUGE_PAGE_BYTES:
        return False
    copies = copy_to_huge_pages(tensors)
    if copies is None:
        return False
    for i, lin in enumerate(lins):
        lin.strips = dataclasses.replace(lin.strips, strips=copies[3 * i], scales=copies[3 * i + 1],
                                         aux=copies[3 * i + 2])
    return True


TILED_HEAD_DIMS = range(16, 129, 16)   # the op's tiled attention (paged_attention.cpp, kMaxD16); else a per-token loop


class NativeDecodeStep:
    """Runs every step through ``decode_forward``; ``build_seconds`` is the load time it added."""

    supports_lora = True   # steps with LoRA adapters too (the op adds each token's delta after every projection)

    def __init__(self, ops, model: LlamaForCausalLM, kv_cache: KVCache, scale: float | None,
                 build_seconds: float = 0.0, huge_pages: HugePageResult | None = None, windows=None):
        """``windows``: per layer, the sliding window the layer serves or None (``backend/attention/window.py``,
        ``serving_windows``); default none anywhere."""
        cfg = model.config
        self.huge_pages = huge_pages   # where the weights went (None: not moved by build)
        self._op = ops.decode_forward
        self.weights = NativeWeights.of(ops, model)
        self.k_cache, self.v_cache = list(kv_cache.k), list(kv_cache.v)
        self.block_size = kv_cache.block_size
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, \
            cfg.head_dim
        self.eps = float(cfg.rms_norm_eps)
        if scale is None:
            scale = cfg.query_scale if cfg.query_scale is not None else 1.0 / math.sqrt(cfg.head_dim)
        self.scale = float(scale)
        self.layer_rope = list(model.layer_rope) if len(self.weights.rope) > 2 else []
        self.activation = ACTIVATION_CODES[cfg.activation]
        self.embed_scale = float(cfg.embed_scale or 1.0)
        self.final_softcap = float(cfg.final_logit_softcapping or 0.0)
        self.batch = PersistentDecodeBatch(kv_cache.block_size)
        self.build_seconds = build_seconds
        self.prefills = cfg.head_dim in TILED_HEAD_DIMS   # prefill chunks too, or decode and verify steps only
        self.windows = [w or 0 for w in windows] if windows and any(windows) else []   # the op's: 0 none

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
        strips_to_huge_pages(model)
        step = cls(build.ops, model, kv_cache, scale, huge_pages=pages, windows=windows)   # packs the panels
        step.build_seconds = time.perf_counter() - t0
        return step

    def accepts(self, plan: SchedulerOutput) -> bool:
        """Decode and verify steps; prefill chunks and their mixes too where the attention is tiled (``prefills``)."""
        return plan.num_batched_tokens > 0 and (self.prefills or decode_step_shape(plan))

    def run(self, plan: SchedulerOutput, lora: LoraBatch | None = None) -> ForwardOutput:
        """Logits of the step's sampled rows, ``[len(rows), vocab]`` (none when no sequence samples); ``lora``: the
        step's adapters, each token's delta added after every projection inside the op."""
        inp = self.batch.prepare(plan)
        logits = self.forward(inp.token_ids, inp.positions, inp.token_rows, inp.block_tables, inp.logit_rows, lora)
        return ForwardOutput(logits, inp.rows) if inp.rows else ForwardOutput(None, [])

    def forward(self, token_ids: torch.Tensor,      # [num_tokens] int64
                positions: torch.Tensor,            # [num_tokens] int64
                token_rows: torch.Tensor,           # [num_tokens] int32  block-table row of each token
                block_tables: torch.Tensor,         # [num_rows, width] int32
                logit_rows: torch.Tensor | None = None,   # [num_logits] int64 increasing token indices; None: all
                lora: LoraBatch | None = None,            # the step's adapters (slots [num_tokens] int32), or None
                ) -> torch.Tensor:
        """Logits ``[num_tokens, vocab]`` (``[num_logits, vocab]``: those tokens'): each token at its position of its
        row's sequence, attending causally to that row's paged KV, within each layer's sliding window (also the
        draft model's steps: ``backend/spec_decode/draft_forward.py``). Table entries wholly before every token's
        window are not read (``NULL_BLOCK`` where the block manager freed them)."""
        w = self.weights
        return self._op(token_ids, positions, token_rows, block_tables, self.block_size, w.embed, w.layer_weights,
                        w.layer_biases, w.layer_panels, self.k_cache, self.v_cache, w.rope, self.layer_rope,
                        w.final_norm, w.lm_head, w.lm_head_panels, self.num_heads, self.num_kv_heads, self.head_dim,
                        self.eps, self.scale, logit_rows, w.layer_quant, w.lm_head_quant,
                        lora.weights.native_tensors if lora is not None else [],
                        lora.slots if lora is not None else None, self.windows, self.activation, self.embed_scale,
                        self.final_softcap)
