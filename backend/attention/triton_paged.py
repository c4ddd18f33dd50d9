"""The GPU attention backend: OpenAI Triton kernels over the paged KV cache.

Same contract as ``TorchPagedAttention``: ``prepare`` once per step, ``forward`` per layer.
A pure-decode step (every sequence has one new token) uses the GQA decode kernel, split
into context partitions (flash-decoding) when the batch alone cannot fill the GPU; any
step with a longer query (prefill chunks, prefix hits, draft verification, mixed batches)
uses the multi-query prefill kernel for every sequence.

A quantized cache (``kv_cache_dtype`` int8 / fp8) is written with its per-token scales by
``reshape_and_cache`` and dequantized on load by both attention kernels; queries and outputs stay in
the compute dtype.
"""
from __future__ import annotations

import torch

from backend.attention.base import AttentionBackend
from backend.attention.kernels.common import check_cache_layout
from backend.attention.kernels.paged_decode import num_partitions, paged_decode_attention
from backend.attention.kernels.paged_prefill import paged_prefill_attention
from backend.attention.kernels.reshape_and_cache import reshape_and_cache
from backend.attention.metadata import AttentionMetadata
from backend.core.kv_cache import KVCache


def use_split_k(num_seqs: int, num_kv_heads: int, parts: int, max_seq_len: int, target_programs: int) -> bool:
    """Split the context when there is more than one partition and the batch leaves the GPU idle
    (fewer ``seq x kv_head`` programs than ``target_programs``), or the context is very long."""
    return parts > 1 and (num_seqs * num_kv_heads < target_programs or max_seq_len > 8192)


class TritonPagedAttention(AttentionBackend):
    def __init__(self, kv_cache: KVCache, scale: float | None = None, partition_tokens: int = 512,
                 split_k: bool | None = None, prefill_block_m: int = 64, target_programs: int | None = None,
                 windows=None):
        """``split_k``: None decides per step (``use_split_k``), True/False forces it.
        ``partition_tokens`` (a multiple of the block size) is the split-K partition length.
        ``windows``: per layer, a sliding window or None (default: none anywhere)."""
        check_cache_layout(kv_cache.k[0], kv_cache.v[0])  # power-of-two block_size >= 16
        bs = kv_cache.block_size
        if partition_tokens % bs:
            raise ValueError(f"partition_tokens ({partition_tokens}) must be a multiple of block_size ({bs})")
        self.kv_cache = kv_cache
        self.scale = scale
        self.windows = tuple(windows) if windows else (None,) * kv_cache.num_layers
        self.blocks_per_partition = partition_tokens // bs
        self.split_k = split_k
        self.prefill_block_m = prefill_block_m
        if target_programs is None:
            dev = kv_cache.device
            sms = torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 64
            target_programs = 2 * sms
        self.target_programs = target_programs
        self.md: AttentionMetadata | None = None
        self._decode_bpp: int | None = None

    def prepare(self, metadata: AttentionMetadata) -> None:
        c = self.kv_cache
        if metadata.block_size and metadata.block_size != c.block_size:
            raise ValueError(f"metadata block_size {metadata.block_size} != cache block_size {c.block_size}")
        md = metadata.to(c.device)
        md.block_tables = md.block_tables.to(torch.int32).contiguous()
        md.seq_lens = md.seq_lens.to(torch.int32).contiguous()
        md.query_start_loc = md.query_start_loc.to(torch.int32).contiguous()
        md.slot_mapping = md.slot_mapping.to(torch.int64).contiguous()
        self.md = md
        parts = num_partitions(md.max_seq_len, c.block_size, self.blocks_per_partition)
        split = self.split_k if self.split_k is not None else use_split_k(
            md.num_seqs, c.num_kv_heads, parts, md.max_seq_len, self.target_programs)
        self._decode_bpp = self.blocks_per_partition if split else None

    def forward(self, layer_idx, q, k, v):
        # q: [num_tokens, num_heads, head_dim]; k, v: [num_tokens, num_kv_heads, head_dim]
        md = self.md
        if md is None:
            raise RuntimeError("TritonPagedAttention.forward before prepare()")
        c = self.kv_cache
        k_cache, v_cache = c.k[layer_idx], c.v[layer_idx]
        scales = {"k_scale": c.k_scale[layer_idx], "v_scale": c.v_scale[layer_idx]}   # None when not quantized
        reshape_and_cache(k, v, k_cache, v_cache, md.slot_mapping, **scales)
        qc = q.to(c.dtype)
        if md.is_pure_decode:
            out = paged_decode_attention(qc, k_cache, v_cache, md.block_tables, md.seq_lens, md.max_seq_len,
                                         self.scale, self._decode_bpp, window=self.windows[layer_idx], **scales)
        else:
            out = paged_prefill_attention(qc, k_cache, v_cache, md.block_tables, md.seq_lens, md.query_start_loc,
                                          md.max_query_len, self.scale, self.prefill_block_m,
                                          window=self.windows[layer_idx], **scales)
        return out.to(q.dtype)
