"""The fast decode step on CUDA: decode and verify steps replayed from CUDA graphs, one per token bucket.

At load, for each bucket ``B`` (1, 2, 4, 8, 16, 32, ... up to ``max_num_seqs * (1 + max_drafts)``) the
model's forward and LM head over ``B`` tokens are captured once, reading static device buffers, one row
per token: token ids, positions, slot mapping, block tables (``[B, ceil(max_model_len / block_size)]``)
and context lengths. A step of ``b <= B`` tokens fills the first ``b`` rows (the rest are padding: slot
-1 writes nothing, length 1 reads block 0) and replays the graph: one launch instead of hundreds.
Attention is the Triton decode kernel, always split into 512-token partitions so that one graph serves
every context length (partitions past a sequence's end return at once).

A verify step (the last known token and ``k`` drafts of each sequence) is a decode step of one row per
token: token ``j`` of a sequence has its sequence's block table and context length ``position + 1``, and
every layer writes all the step's K/V before its attention reads, so draft ``j`` sees the drafts before it
and none after (``static_inputs``). **Verify steps through CUDA graphs have not run on a GPU yet**: only
their CPU-side inputs are tested here (tests/backend/engine/test_cuda_graph_decode.py).

Mixed prefill steps stay eager; quantized weights (their kernels may synchronise) and models with sliding
windows are left to the eager path too (``unsupported_reason``). This module only imports Triton when a
step is built (never on the CPU).
"""
from __future__ import annotations

import time

import numpy as np
import torch

from backend.attention.base import AttentionBackend
from backend.core.kv_cache import KVCache
from backend.core.plan import ForwardOutput, SchedulerOutput
from backend.engine.decode_batch import DecodeInputs, PersistentDecodeBatch, decode_step_shape, eager_only_reason
from backend.model.llama import LlamaForCausalLM

PARTITION_TOKENS = 512


def batch_buckets(max_num_seqs: int) -> list[int]:
    """Powers of two below ``max_num_seqs``, then ``max_num_seqs`` itself."""
    out, b = [], 1
    while b < max_num_seqs:
        out.append(b)
        b *= 2
    return out + [max_num_seqs]


def fits(plan: SchedulerOutput, max_tokens: int) -> bool:
    """A decode or verify step of at most ``max_tokens`` tokens (the largest captured bucket)."""
    return plan.num_batched_tokens <= max_tokens and decode_step_shape(plan)


def static_inputs(inp: DecodeInputs, block_size: int, width: int) -> dict[str, np.ndarray]:
    """The graph's per-token rows for a step: ids, positions [b] int64; slots [b] int64 (where each token's K/V
    go); lens [b] int32 (the context each token attends to, itself included); tables [b, width] int32 (its
    sequence's block table, cut to ``width``)."""
    rows, pos = inp.token_rows.numpy(), inp.positions.numpy()
    table = inp.block_tables.numpy()
    return {"ids": inp.token_ids.numpy(), "pos": pos,
            "slots": table[rows, pos // block_size].astype(np.int64) * block_size + pos % block_size,
            "lens": (pos + 1).astype(np.int32), "tables": table[rows, :width]}


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

    supports_lora = False   # steps with LoRA adapters run eagerly (the captured graphs have no delta)

    def __init__(self, model: LlamaForCausalLM, kv_cache: KVCache, scale: float | None, max_num_seqs: int,
                 max_model_len: int, max_drafts: int = 0):
        if kv_cache.block_size > PARTITION_TOKENS or PARTITION_TOKENS % kv_cache.block_size:
            raise ValueError(f"block_size: {kv_cache.block_size} does not divide {PARTITION_TOKENS}")
        dev = kv_cache.device
        self.model, self.kv_cache, self.block_size = model, kv_cache, kv_cache.block_size
        self.max_model_len = max_model_len
        width = -(-max_model_len // kv_cache.block_size)
        self.buckets = batch_buckets(max_num_seqs * (1 + max_drafts))   # tokens per step
        n = self.buckets[-1]
        self.batch = PersistentDecodeBatch(kv_cache.block_size, rows=max_num_seqs, width=width, tokens=n)
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
              max_model_len: int, max_drafts: int = 0) -> CudaGraphDecodeStep | str:
        """``max_drafts``: the most drafts per sequence of a verify step (0: no speculation)."""
        reason = unsupported_reason(model, kv_cache, windows)
        if reason is not None:
            return reason
        step = cls(model, kv_cache, scale, max_num_seqs, max_model_len, max_drafts)
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
        """A decode or verify step of at most the largest bucket's tokens."""
        return fits(plan, self.buckets[-1])

    @torch.inference_mode()
    def run(self, plan: SchedulerOutput) -> ForwardOutput:
        inp = self.batch.prepare(plan)
        b = len(inp.rows)                                        # tokens (a verify step: k + 1 per sequence)
        bucket = next(x for x in self.buckets if x >= b)
        h = self._host
        for k, v in static_inputs(inp, self.block_size, h["tables"].shape[1]).items():
            h[k].numpy()[:b] = v
        h["slots"][b:bucket] = -1     # padding rows: no K/V write, a one-token context
        h["lens"][b:bucket] = 1
        h["tables"][b:bucket] = 0
        for k, dev in self._dev.items():
            dev[:bucket].copy_(h[k][:bucket], non_blocking=True)
        graph, logits = self._graphs[bucket]
        graph.replay()
        return ForwardOutput(logits[:b].clone(), inp.rows)   # [b tokens, vocab] fp32 (the graph's buffer is reused)
