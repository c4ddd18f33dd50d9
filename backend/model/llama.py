"""The decoder of every declared family (``architecture.py``: Llama, Mistral, Qwen2, Qwen3, Phi-3, Gemma 3) over flat
token batches; each layer's blocks are what the family declares: the norm (RMSNorm, Gemma's ``1 + w``) and where
the layer puts its norms (before attention and MLP, or Gemma's sandwich: after each too), q/k norms, biases, the
MLP's activation (SwiGLU, GeGLU-tanh), partial RoPE and a second RoPE table for sliding layers, the embedding scale,
final logit soft-capping. ``ATTENTION_BLOCKS`` and ``MLP_BLOCKS`` map the declaration's block names to the modules
the layer builds.

The model sees one flat list of tokens per step (all sequences end to end) with
their positions; attention, and with it the KV cache, belongs to an
``AttentionBackend`` passed to ``forward``. So one forward serves training,
prefill chunks, decodes and draft verification alike.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from backend.attention.base import AttentionBackend
from backend.model.config import ModelConfig
from backend.model.projection_delta import DOWN, GATE_UP, O, QKV, ProjectionDelta
from backend.model.rope import apply_rope, rope_cos_sin, rope_parameters


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm computed in fp32, cast back (as HF does). ``x`` ``[num_tokens, hidden]``."""
    if x.dtype == torch.float32:  # the CPU path: skip the no-op casts
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))
    dtype = x.dtype
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(dtype)


def rms_norm_offset(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Gemma's RMSNorm: ``x_normed * (1 + weight)`` computed in fp32, cast back (as HF does). ``x`` ``[..., dim]``."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    out = xf * (1.0 + weight.float())
    return out if out.dtype == x.dtype else out.to(x.dtype)


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """GELU with the tanh approximation (transformers' ``gelu_pytorch_tanh``)."""
    return F.gelu(x, approximate="tanh")


ACTIVATION_FNS = {"silu": F.silu, "gelu_tanh": gelu_tanh}   # ModelConfig.activation -> the gated MLP's function


def softcap(x: torch.Tensor, cap: float) -> torch.Tensor:
    """Tanh soft-capping: ``cap * tanh(x / cap)`` (as transformers: divide, tanh, multiply)."""
    return torch.tanh(x / cap) * cap


def linear(x: torch.Tensor, layer: nn.Module) -> torch.Tensor:
    """``layer(x)`` without ``nn.Module.__call__``'s hook machinery (it dominates tiny decode steps).

    ``layer`` is an ``nn.Linear`` or a ``backend.model.quant.QuantLinear`` (which has no ``weight``)."""
    weight = getattr(layer, "weight", None)
    if weight is None:
        return layer.forward(x)
    return F.linear(x, weight, layer.bias)


class RMSNorm(nn.Module):
    """``weight * x_normed``; with ``offset`` (Gemma) ``(1 + weight) * x_normed`` (weight 0: the identity scale)."""

    def __init__(self, dim: int, eps: float, offset: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim) if offset else torch.ones(dim))
        self.eps = eps
        self.offset = offset

    def forward(self, x):
        return rms_norm_offset(x, self.weight, self.eps) if self.offset else rms_norm(x, self.weight, self.eps)

    def scale(self) -> torch.Tensor:
        """What multiplies ``x_normed`` (``[dim]``): the weight, or ``1 + weight`` in fp32 with ``offset``."""
        return 1.0 + self.weight.detach().float() if self.offset else self.weight.detach()

    __call__ = forward  # no hooks on the hot path


def make_norm(cfg: ModelConfig, dim: int) -> RMSNorm:
    """The family's RMSNorm (``Architecture.norm``) over ``dim`` values."""
    return RMSNorm(dim, cfg.rms_norm_eps, offset=cfg.architecture.norm == "rms_offset")


class Attention(nn.Module):
    """GQA self-attention with a fused QKV projection (split back into HF names on save); with ``q_norm`` /
    ``k_norm`` (Qwen3) each q and k head is RMS-normed before RoPE."""

    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=cfg.o_proj_bias)
        qk_norm = cfg.architecture.qk_norm
        self.q_norm = make_norm(cfg, self.head_dim) if qk_norm else None
        self.k_norm = make_norm(cfg, self.head_dim) if qk_norm else None

    def forward(self, x, cos, sin, attn: AttentionBackend, rope=apply_rope, lora: ProjectionDelta | None = None):
        # x: [num_tokens, hidden]; cos/sin: [num_tokens, 1, rotary_dim]; rope: apply_rope or a fused kernel;
        # lora: the step's adapters (a delta after each projection), or None
        n = x.shape[0]
        qkv = linear(x, self.qkv_proj)
        if lora is not None:
            lora.add(self.layer_idx, QKV, x, qkv)
        qkv = qkv.view(n, self.num_heads + 2 * self.num_kv_heads, self.head_dim)
        qk = qkv[:, :self.num_heads + self.num_kv_heads]
        if self.q_norm is not None:
            qk = torch.cat((self.q_norm(qk[:, :self.num_heads]), self.k_norm(qk[:, self.num_heads:])), dim=1)
        qk = rope(qk, cos, sin)  # q and k rotated together
        q, k = qk.split([self.num_heads, self.num_kv_heads], dim=1)
        v = qkv[:, self.num_heads + self.num_kv_heads:]
        out = attn.forward(self.layer_idx, q, k, v).reshape(n, self.q_size)  # [num_tokens, num_heads * head_dim]
        o = linear(out, self.o_proj)
        if lora is not None:
            lora.add(self.layer_idx, O, out, o)
        return o

    __call__ = forward


class MLP(nn.Module):
    """The gated MLP, ``act(gate) * up`` then down (SwiGLU, or GeGLU-tanh: ``ModelConfig.activation``), with a fused
    gate/up projection."""

    def __init__(self, cfg: ModelConfig, layer_idx: int = 0):
        super().__init__()
        self.layer_idx = layer_idx
        self.intermediate = cfg.intermediate_size
        self.act = ACTIVATION_FNS[cfg.activation]
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)

    def forward(self, x, silu_mul=None, lora: ProjectionDelta | None = None):
        # x: [num_tokens, hidden]; silu_mul: None (torch) or a fused SiLU kernel of [num_tokens, 2 * intermediate]
        gate_up = linear(x, self.gate_up_proj)
        if lora is not None:
            lora.add(self.layer_idx, GATE_UP, x, gate_up)
        if silu_mul is not None:
            act = silu_mul(gate_up)
        else:
            gate, up = gate_up.split(self.intermediate, dim=-1)
            act = self.act(gate) * up
        down = linear(act, self.down_proj)
        if lora is not None:
            lora.add(self.layer_idx, DOWN, act, down)
        return down

    __call__ = forward


ATTENTION_BLOCKS = {"gqa": Attention}   # Architecture.attention -> the layer's attention block
MLP_BLOCKS = {"gated": MLP}             # Architecture.mlp -> its MLP block


class DecoderLayer(nn.Module):
    """Norm, attention, residual add; norm, MLP, residual add. With ``layer_norms`` "sandwich" (Gemma) the attention's
    and the MLP's outputs are normed too before their residual add: ``post_attention_layernorm`` is then the
    attention output's norm and ``pre_feedforward_layernorm`` the MLP input's (HF's names)."""

    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        arch = cfg.architecture
        self.input_layernorm = make_norm(cfg, cfg.hidden_size)
        self.self_attn = ATTENTION_BLOCKS[arch.attention](cfg, layer_idx)
        self.post_attention_layernorm = make_norm(cfg, cfg.hidden_size)
        self.mlp = MLP_BLOCKS[arch.mlp](cfg, layer_idx)
        self.sandwich = arch.layer_norms == "sandwich"
        if self.sandwich:
            self.pre_feedforward_layernorm = make_norm(cfg, cfg.hidden_size)
            self.post_feedforward_layernorm = make_norm(cfg, cfg.hidden_size)

    @property
    def mlp_norm(self) -> RMSNorm:
        """The norm of the MLP's input."""
        return self.pre_feedforward_layernorm if self.sandwich else self.post_attention_layernorm

    @property
    def output_norms(self) -> tuple[RMSNorm | None, RMSNorm | None]:
        """The norms of the attention's and the MLP's outputs (sandwich), else (None, None)."""
        return (self.post_attention_layernorm, self.post_feedforward_layernorm) if self.sandwich else (None, None)

    def forward(self, x, cos, sin, attn, lora: ProjectionDelta | None = None):
        a = self.self_attn(self.input_layernorm(x), cos, sin, attn, lora=lora)
        if self.sandwich:
            a = self.post_attention_layernorm(a)
        x = x + a
        m = self.mlp(self.mlp_norm(x), lora=lora)
        if self.sandwich:
            m = self.post_feedforward_layernorm(m)
        return x + m

    __call__ = forward


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig, max_positions: int | None = None):
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = make_norm(cfg, cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        with torch.device("cpu"):  # real tensors even when the weights are built on 'meta'
            # one RoPE per table: the model's, and the sliding layers' own when the family has one (Gemma 3)
            self._ropes = [rope_parameters(cfg)] + ([rope_parameters(cfg, local=True)]
                                                    if cfg.local_rope_theta is not None else [])
        self.layer_rope = cfg.layer_rope   # per layer: its table
        self.max_positions = max_positions or cfg.exact_positions
        self._tables: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        self.fused = None   # FusedOps (backend/model/fused.py): Triton elementwise kernels, set on CUDA by the builder
        arch = cfg.architecture
        # the blocks _forward_fused fuses: RMSNorm before attention and MLP, SiLU, one RoPE table
        self.fusable = (arch.norm, arch.layer_norms, cfg.activation, len(self._ropes)) == ("rms", "pre", "silu", 1)

    def all_rope_tables(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per RoPE table (``layer_rope`` indexes them), ``cos, sin`` ``[max_positions, rotary_dim]`` in the model's
        dtype, built once per device."""
        w = self.embed_tokens.weight
        if self._tables is None or self._tables[0][0].device != w.device or self._tables[0][0].dtype != w.dtype:
            self._tables = [rope_cos_sin(*rope, self.max_positions, w.dtype, w.device) for rope in self._ropes]
        return self._tables

    def rope_tables(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The model's ``cos, sin`` ``[max_positions, rotary_dim]`` (table 0)."""
        return self.all_rope_tables()[0]

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """``[num_tokens, hidden]``: the embeddings, times ``ModelConfig.embed_scale`` where the family scales them
        (as HF: the scale a float32 tensor cast to the embedding's dtype)."""
        x = F.embedding(input_ids, self.embed_tokens.weight)
        scale = self.config.embed_scale
        return x if scale is None else x * torch.tensor(scale, dtype=torch.float32).to(x.dtype)

    def forward(
        self,
        input_ids: torch.Tensor,  # [num_tokens]
        positions: torch.Tensor,  # [num_tokens]
        attn: AttentionBackend,
        lora: ProjectionDelta | None = None,   # the step's adapters (a LoraBatch, backend/lora/delta.py), or None
    ) -> torch.Tensor:            # [num_tokens, hidden] final-normed hidden states
        ropes = [(cos_t[positions].unsqueeze(1), sin_t[positions].unsqueeze(1))   # [num_tokens, 1, rotary_dim]
                 for cos_t, sin_t in self.all_rope_tables()]
        x = self.embed(input_ids)
        if self.fused is not None and self.fusable:
            return self._forward_fused(x, *ropes[0], attn, lora)
        for layer, table in zip(self.layers, self.layer_rope):
            x = layer(x, *ropes[table], attn, lora)
        return self.norm(x)

    def _forward_fused(self, x, cos, sin, attn: AttentionBackend, lora: ProjectionDelta | None = None) -> torch.Tensor:
        """The layers with the residual carried beside the hidden state: each RMSNorm takes the residual add
        before it (``add_rms_norm``), RoPE and SiLU-mul are one kernel each. Same maths as ``forward``."""
        ops = self.fused
        rope = ops.rope if self.config.rope_dim == self.config.head_dim else apply_rope   # the kernel: whole heads
        norms = [layer.input_layernorm for layer in self.layers][1:] + [self.norm]
        first = self.layers[0].input_layernorm
        h, residual = ops.add_rms_norm(x, None, first.weight, first.eps)
        for layer, next_norm in zip(self.layers, norms):
            h = layer.self_attn(h, cos, sin, attn, rope, lora)
            post = layer.post_attention_layernorm
            h, residual = ops.add_rms_norm(h, residual, post.weight, post.eps)
            h = layer.mlp(h, ops.silu_mul, lora)
            h, residual = ops.add_rms_norm(h, residual, next_norm.weight, next_norm.eps)
        return h

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden`` ``[n, hidden]`` → logits ``[n, vocab]`` (fp32), soft-capped where the config says
        (``final_logit_softcapping``, in the model's dtype as HF)."""
        logits = linear(hidden, self.lm_head)
        cap = self.config.final_logit_softcapping
        return (logits if cap is None else softcap(logits, cap)).float()
