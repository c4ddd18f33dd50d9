"""Persistent inputs of the fast step (vLLM v1's persistent batch): decode, verify and, on the CPU, prefill.

A running sequence keeps one row of a block-table buffer from its first fast step until it finishes
or is preempted; each step rewrites only the tail of its row that can have changed since the last
one (the blocks from the one holding ``num_computed_tokens`` on: new blocks, a copy-on-write of the
partly filled block, blocks released after rejected drafts), so a long context costs nothing per
step. The step's tokens (the last known token and the drafts of every sequence), their positions
and their rows go into preallocated buffers; ``prepare`` returns views of them, so the hot path
allocates no tensor.

A step is a *decode step* when every scheduled sequence computes exactly its last known token plus
its drafts and samples after each (``decode_step_shape``): every token's logits are sampled. Other
steps (prefill chunks, alone or mixed with decodes) sample only the last token of each sequence that
samples (and a verify's k before it): ``DecodeInputs.logit_rows`` lists those tokens, the native
step computes logits for them alone, and CUDA graphs leave such steps to the eager runner.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from backend.core.kv_cache import KVCache
from backend.core.plan import SchedulerOutput
from backend.model.llama import LlamaForCausalLM


@dataclass(frozen=True)
class DecodeInputs:
    token_ids: torch.Tensor     # [num_tokens] int64 (views of the persistent buffers)
    positions: torch.Tensor     # [num_tokens] int64
    token_rows: torch.Tensor    # [num_tokens] int32  block-table row of each token
    block_tables: torch.Tensor  # [num_rows, width] int32  the whole persistent table
    rows: list[int]             # plan index of every sampled row, in order
    logit_rows: torch.Tensor | None = None   # [len(rows)] int64 token index of each sampled row; None: every token


def sampled_token_indices(plan: SchedulerOutput) -> list[int]:
    """The step's token index of each sampled row, in order: the last ``k + 1`` tokens of each sequence that samples
    (its last token and its ``k`` drafts). Built only for steps that are not decode steps, where it says which
    tokens the op computes logits for."""
    picks, at = [], 0
    for s in plan.scheduled:
        at += s.num_new_tokens
        if s.sample:
            picks.extend(range(at - 1 - s.num_draft_tokens, at))
    return picks


def decode_step_shape(plan: SchedulerOutput) -> bool:
    """Every sequence computes its last known token and its drafts, and samples after each."""
    for s in plan.scheduled:
        seq = s.seq
        if not s.sample or s.num_new_tokens != s.num_draft_tokens + 1 \
                or seq.num_computed_tokens != seq.num_tokens - 1:
            return False
    return bool(plan.scheduled)


def kv_format_reason(kv_cache: KVCache) -> str | None:
    """What every fast step (native on the CPU, CUDA graphs) leaves to the eager path: a quantized KV cache."""
    if kv_cache.format.quantized:
        return f"an {kv_cache.format.name} KV cache (kv_cache_dtype) runs eagerly"
    return None


def cache_or_window_reason(kv_cache: KVCache, windows) -> str | None:
    """What the CUDA-graph step leaves to the eager path besides quantized weights: a quantized KV cache,
    sliding-window layers (the native CPU step takes windows). None when neither applies."""
    if reason := kv_format_reason(kv_cache):
        return reason
    if any(w is not None for w in windows):
        return "sliding-window layers run eagerly"
    return None


def eager_only_reason(model: LlamaForCausalLM, kv_cache: KVCache, windows) -> str | None:
    """What the CUDA-graph step leaves to the eager path: ``cache_or_window_reason``'s cases and quantized linear
    layers (the native CPU step takes those it has the GEMM's strips for: ``native_decode.unsupported_reason``)."""
    if reason := cache_or_window_reason(kv_cache, windows):
        return reason
    for layer in model.layers:
        for lin in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj):
            if type(lin) is not nn.Linear:
                return f"quantized weights ({type(lin).__name__}) run eagerly"
    return None


class PersistentDecodeBatch:
    """Rows of a block-table buffer per running sequence, and the step's token buffers."""

    def __init__(self, block_size: int, rows: int = 8, width: int = 16, tokens: int = 64):
        self.block_size = block_size
        self._table = np.zeros((rows, width), dtype=np.int32)
        self._tokens = np.zeros(tokens, dtype=np.int64)
        self._positions = np.zeros(tokens, dtype=np.int64)
        self._token_rows = np.zeros(tokens, dtype=np.int32)
        self._wrap()
        self._row_of: dict[int, int] = {}          # seq_id -> row
        self._synced: dict[int, int] = {}          # seq_id -> leading entries of its row already written
        self._free_rows = list(range(rows - 1, -1, -1))

    def _wrap(self) -> None:
        self.block_tables = torch.from_numpy(self._table)   # shares memory: no copy per step
        self._t_tokens = torch.from_numpy(self._tokens)
        self._t_positions = torch.from_numpy(self._positions)
        self._t_rows = torch.from_numpy(self._token_rows)

    @property
    def num_rows_in_use(self) -> int:
        return len(self._row_of)

    def seq_ids(self) -> list[int]:
        return list(self._row_of)

    def row_of(self, seq_id: int) -> int | None:
        return self._row_of.get(seq_id)

    def release(self, seq_ids) -> None:
        """Forget finished, aborted or preempted sequences (their rows are reused)."""
        for seq_id in seq_ids:
            row = self._row_of.pop(seq_id, None)
            if row is not None:
                self._synced.pop(seq_id, None)
                self._free_rows.append(row)

    def forget_plan(self, plan: SchedulerOutput) -> None:
        """Drop the rows the plan says are gone (called for every plan, fast or eager)."""
        if plan.finished_seq_ids:
            self.release(plan.finished_seq_ids)
        if plan.preempted:
            self.release(s.seq_id for s in plan.preempted)

    def _grow(self, rows: int, width: int, tokens: int) -> None:
        r0, w0 = self._table.shape
        if rows > r0 or width > w0:
            table = np.zeros((max(rows, 2 * r0 if rows > r0 else r0), max(width, 2 * w0 if width > w0 else w0)),
                             dtype=np.int32)
            table[:r0, :w0] = self._table
            self._free_rows.extend(range(table.shape[0] - 1, r0 - 1, -1))
            self._table = table
        if tokens > self._tokens.shape[0]:
            n = max(tokens, 2 * self._tokens.shape[0])
            self._tokens = np.zeros(n, dtype=np.int64)
            self._positions = np.zeros(n, dtype=np.int64)
            self._token_rows = np.zeros(n, dtype=np.int32)
        self._wrap()

    def _sync_row(self, seq) -> int:
        """The sequence's row, its block table written from the first entry that may have changed."""
        row = self._row_of.get(seq.seq_id)
        if row is None:
            if not self._free_rows:
                self._grow(self._table.shape[0] + 1, 0, 0)
            row = self._free_rows.pop()
            self._row_of[seq.seq_id] = row
            start = 0
        else:
            start = min(self._synced[seq.seq_id], seq.num_computed_tokens // self.block_size)
        table = seq.block_table
        n = len(table)
        if n > self._table.shape[1]:
            self._grow(0, n, 0)
        if n > start:
            self._table[row, start:n] = table[start:] if start else table
        self._synced[seq.seq_id] = n
        return row

    def prepare(self, plan: SchedulerOutput) -> DecodeInputs:
        """Fill the buffers for the plan's step: each sequence's new tokens at their positions and row."""
        num_tokens = plan.num_batched_tokens
        if num_tokens > self._tokens.shape[0]:
            self._grow(0, 0, num_tokens)
        tokens, positions, token_rows = self._tokens, self._positions, self._token_rows
        rows: list[int] = []
        every_token = True         # a decode step: every token is sampled
        at = 0
        for i, s in enumerate(plan.scheduled):
            seq = s.seq
            row = self._sync_row(seq)
            pos = seq.num_computed_tokens
            n, k = s.num_new_tokens, s.num_draft_tokens
            if n == k + 1 and pos == seq.num_tokens - 1:     # the last known token, then the drafts
                out = seq.output_token_ids
                tokens[at] = out[-1] if out else seq.prompt_token_ids[-1]
                if k:
                    tokens[at + 1:at + 1 + k] = seq.draft_token_ids[:k]
            else:                                             # a prefill chunk (or a recompute after preemption)
                tokens[at:at + n] = seq.token_ids_between(pos, pos + n)
                every_token = False
            if n == 1:
                positions[at] = pos
                token_rows[at] = row
            else:
                positions[at:at + n] = np.arange(pos, pos + n)
                token_rows[at:at + n] = row
            if s.sample:
                rows.extend([i] * (k + 1))
            else:
                every_token = False
            at += n
        if at != num_tokens:
            raise ValueError(f"step has {at} tokens, the plan says {num_tokens}")
        logit_rows = None if every_token else torch.tensor(sampled_token_indices(plan) or [at - 1], dtype=torch.int64)
        return DecodeInputs(self._t_tokens[:at], self._t_positions[:at], self._t_rows[:at], self.block_tables, rows,
                            logit_rows)
