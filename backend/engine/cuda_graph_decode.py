"""The fast decode step on CUDA: pure decode steps replayed from CUDA graphs, one per batch bucket.

At load, for each bucket ``B`` (1, 2, 4, 8, 16, 32, ... up to ``max_num_seqs``) the model's forward and
LM head over ``B`` tokens are captured once, reading static device buffers: token ids, positions, slot
mapping, block tables (``[max_num_seqs, ceil(max_model_len / block_size)]``) and sequence lengths.
A step of ``b <= B`` sequences fills the first ``b`` rows (the rest are padding: slot -1 writes
nothing, length 1 reads block 0) and replays the graph: one launch instead of hundreds. Attention is
the Triton decode kernel, always split into 512-token partitions so that one graph serves every
context length (partitions past a sequence's end return at once).

Verify steps (drafts) and mixed prefill steps stay eager; quantized weights (their kernels may
synchronise) and models with sliding windows are left to the eager path too (``unsupported_reason``).
This module only imports Triton when a step is built (never on the CPU).
"""
from __future__ import annotations

import time

import numpy as np
import torch

from backend.attention.base import AttentionBackend
from backend.core.kv_cache import KVCache
from backend.core.plan import ForwardOutput, SchedulerOutput
from backend.engine.decode_batch import PersistentDecodeBatch, decode_step_shape, eager_only_reason
from backend.model.llama import LlamaForCausalLM

PARTITION_TOKENS = 512


def batch_buckets(max_num_seqs: int) -> list[int]:
    """Powers of two below ``max_num_seqs``, then ``max_num_seqs`` itself."""
    out, b = [], 1
    while b < max_num_seqs:
        out.append(b)
        b *= 2
    return out + [max_num_seqs]


def unsupported_reason(model: LlamaForCausalLM, kv_cache: KVCache, windows) -> str | None:
    if kv_cache.device.type != "cuda":
        return "CUDA graphs need the KV cache on a CUDA device"
    if kv_cache.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return f"a {kv_cache.dtype} KV cache runs eagerly"
    return eager_only_reason(model, kv_cache, windows)


class StaticDecodeAttention(AttentionBackend):
    """The decode attention of a captured step: every argument is a fixed device buffer."""

    def __init__(self, kv_cache: KVCache, scale: float | None, slot_mapping: torch.Tensor,
                 block_tables: torch.Tensor, seq_lens: torch.Tensor, max_seq_len: int):
        self.kv_cache, self.scale = kv_cache, scale
        self.slot_mapping = slot_mapping     # [B] int64
        self.block_tables = block_tables     # [B, width] int32
        self.seq_lens = seq_lens             # [B] int32
        self.max_seq_len = max_seq_len
        self.bpp = PARTITION_TOKENS // kv_cache.block_size

    def prepare(self, metadata) -> None:  # the buffers are filled by CudaGraphDecodeStep.run
        pass

    def forward(self, layer_idx, q, k, v):
        # q: [B, num_heads, head_dim]; k, v: [B, num_kv_heads, head_dim]
        from backend.attention.kernels.paged_decode import paged_decode_attention
        from backend.attention.kernels.reshape_and_cache import reshape_and_cache
        k_cache, v_cache = self.kv_cache.k[layer_idx], self.kv_cache.v[layer_idx]
        reshape_and_cache(k, v, k_cache, v_cache, self.slot_mapping)
        out = paged_decode_attention(q.to(k_cache.dtype), k_cache, v_cache, self.block_tables, self.seq_lens,
                                     self.max_seq_len, self.scale, self.bpp)
        return out.to(q.dtype)


class CudaGraphDecodeStep:
    """Captured decode steps; ``build_seconds`` is the capture time added to the load."""

    def __init__(self, model: LlamaForCausalLM, kv_cache: KVCache, scale: float | None, max_num_seqs: int,
                 max_model_len: int):
        if kv_cache.block_size > PARTITION_TOKENS or PARTITION_TOKENS % kv_cache.block_size:
            raise ValueError(f"block_size: {kv_cache.block_size} does not divide {PARTITION_TOKENS}")
        dev = kv_cache.device
        self.model, self.kv_cache, self.block_size = model, kv_cache, kv_cache.block_size
        self.max_model_len = max_model_len
        width = -(-max_model_len // kv_cache.block_size)
        self.buckets = batch_buckets(max_num_seqs)
        n = self.buckets[-1]
        self.batch = PersistentDecodeBatch(kv_cache.block_size, rows=n, width=width, tokens=n)
        # device inputs the graphs read, and their pinned host staging
        self._host = {"ids": torch.zeros(n, dtype=torch.int64).pin_memory(),
                      "pos": torch.zeros(n, dtype=torch.int64).pin_memory(),
                      "slots": torch.full((n,), -1, dtype=torch.int64).pin_memory(),
                      "lens": torch.ones(n, dtype=torch.int32).pin_memory(),
                      "tables": torch.zeros(n, width, dtype=torch.int32).pin_memory()}
        self._dev = {k: v.to(dev) for k, v in self._host.items()}
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._scale = scale
        self.build_seconds = 0.0

    @classmethod
    def build(cls, model: LlamaForCausalLM, kv_cache: KVCache, windows, scale: float | None, max_num_seqs: int,
              max_model_len: int) -> CudaGraphDecodeStep | str:
        reason = unsupported_reason(model, kv_cache, windows)
        if reason is not None:
            return reason
        step = cls(model, kv_cache, scale, max_num_seqs, max_model_len)
        step.capture()
        return step

    @torch.inference_mode()
    def capture(self) -> None:
        """Warm up (Triton compiles its kernels) and capture one graph per bucket, largest first."""
        t0 = time.perf_counter()
        pool = None
        d = self._dev
        for b in sorted(self.buckets, reverse=True):
            attn = StaticDecodeAttention(self.kv_cache, self._scale, d["slots"][:b], d["tables"][:b], d["lens"][:b],
                                         self.max_model_len)

            def forward(b=b, attn=attn):
                return self.model.compute_logits(self.model(d["ids"][:b], d["pos"][:b], attn))

            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):
                    forward()
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                logits = forward()
            pool = graph.pool()
            self._graphs[b] = (graph, logits)
        torch.cuda.synchronize()
        self.build_seconds = time.perf_counter() - t0

    def accepts(self, plan: SchedulerOutput) -> bool:
        """A pure decode step (no drafts) of at most the largest bucket."""
        return len(plan.scheduled) <= self.buckets[-1] and plan.num_batched_tokens == len(plan.scheduled) \
            and decode_step_shape(plan)

    @torch.inference_mode()
    def run(self, plan: SchedulerOutput) -> ForwardOutput:
        inp = self.batch.prepare(plan)
        b = len(inp.rows)
        bucket = next(x for x in self.buckets if x >= b)
        h = self._host
        rows = inp.token_rows.numpy()
        pos = inp.positions.numpy()
        table = inp.block_tables.numpy()
        h["ids"][:b] = inp.token_ids
        h["pos"][:b] = inp.positions
        h["tables"].numpy()[:b] = table[rows, :h["tables"].shape[1]]
        h["slots"].numpy()[:b] = table[rows, pos // self.block_size].astype(np.int64) * self.block_size \
            + pos % self.block_size
        h["lens"].numpy()[:b] = pos + 1
        h["slots"][b:bucket] = -1     # padding rows: no K/V write, a one-token context
        h["lens"][b:bucket] = 1
        h["tables"][b:bucket] = 0
        for k, dev in self._dev.items():
            dev[:bucket].copy_(h[k][:bucket], non_blocking=True)
        graph, logits = self._graphs[bucket]
        graph.replay()
        return ForwardOutput(logits[:b].clone(), inp.rows)   # [b, vocab] fp32 (the graph's buffer is reused)
