"""The decoder of every declared family (``architecture.py``: Llama, Mistral, Qwen2, Qwen3, Phi-3) over flat
token batches; each layer's blocks are what the family declares (q/k norms, biases, partial RoPE).

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
from backend.lora.delta import LoraBatch
from backend.lora.stacked import DOWN, GATE_UP, O, QKV
from backend.model.config import ModelConfig
from backend.model.rope import apply_rope, rope_cos_sin, rope_parameters


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm computed in fp32, cast back (as HF does). ``x`` ``[num_tokens, hidden]``."""
    if x.dtype == torch.float32:  # the CPU path: skip the no-op casts
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))
    dtype = x.dtype
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(dtype)


def linear(x: torch.Tensor, layer: nn.Module) -> torch.Tensor:
    """``layer(x)`` without ``nn.Module.__call__``'s hook machinery (it dominates tiny decode steps).

    ``layer`` is an ``nn.Linear`` or a ``backend.model.quant.QuantLinear`` (which has no ``weight``)."""
    weight = getattr(layer, "weight", None)
    if weight is None:
        return layer.forward(x)
    return F.linear(x, weight, layer.bias)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)

    __call__ = forward  # no hooks on the hot path


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
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if qk_norm else None

    def forward(self, x, cos, sin, attn: AttentionBackend, rope=apply_rope, lora: LoraBatch | None = None):
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
    """SwiGLU with a fused gate/up projection."""

    def __init__(self, cfg: ModelConfig, layer_idx: int = 0):
        super().__init__()
        self.layer_idx = layer_idx
        self.intermediate = cfg.intermediate_size
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)

    def forward(self, x, silu_mul=None, lora: LoraBatch | None = None):
        # x: [num_tokens, hidden]; silu_mul: None (torch) or a fused kernel of [num_tokens, 2 * intermediate]
        gate_up = linear(x, self.gate_up_proj)
        if lora is not None:
            lora.add(self.layer_idx, GATE_UP, x, gate_up)
        if silu_mul is not None:
            act = silu_mul(gate_up)
        else:
            gate, up = gate_up.split(self.intermediate, dim=-1)
            act = F.silu(gate) * up
        down = linear(act, self.down_proj)
        if lora is not None:
            lora.add(self.layer_idx, DOWN, act, down)
        return down

    __call__ = forward


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer_idx)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg, layer_idx)

    def forward(self, x, cos, sin, attn, lora: LoraBatch | None = None):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, attn, lora=lora)
        return x + self.mlp(self.post_attention_layernorm(x), lora=lora)

    __call__ = forward


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig, max_positions: int | None = None):
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        with torch.device("cpu"):  # real tensors even when the weights are built on 'meta'
            inv_freq, scaling = rope_parameters(cfg)
        self._rope = (inv_freq, scaling)
        self.max_positions = max_positions or cfg.exact_positions
        self._cos = self._sin = None
        self.fused = None   # FusedOps (backend/model/fused.py): Triton elementwise kernels, set on CUDA by the builder

    def rope_tables(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``cos, sin`` ``[max_positions, rotary_dim]`` in the model's dtype, built once per device."""
        w = self.embed_tokens.weight
        if self._cos is None or self._cos.device != w.device or self._cos.dtype != w.dtype:
            self._cos, self._sin = rope_cos_sin(*self._rope, self.max_positions, w.dtype, w.device)
        return self._cos, self._sin

    def forward(
        self,
        input_ids: torch.Tensor,  # [num_tokens]
        positions: torch.Tensor,  # [num_tokens]
        attn: AttentionBackend,
        lora: LoraBatch | None = None,   # the step's adapters per token (backend/lora/delta.py), or None
    ) -> torch.Tensor:            # [num_tokens, hidden] final-normed hidden states
        cos_t, sin_t = self.rope_tables()
        cos, sin = cos_t[positions].unsqueeze(1), sin_t[positions].unsqueeze(1)  # [num_tokens, 1, rotary_dim]
        x = F.embedding(input_ids, self.embed_tokens.weight)
        if self.fused is not None:
            return self._forward_fused(x, cos, sin, attn, lora)
        for layer in self.layers:
            x = layer(x, cos, sin, attn, lora)
        return self.norm(x)

    def _forward_fused(self, x, cos, sin, attn: AttentionBackend, lora: LoraBatch | None = None) -> torch.Tensor:
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
        """``hidden`` ``[n, hidden]`` → logits ``[n, vocab]`` (fp32)."""
        return linear(hidden, self.lm_head).float()
