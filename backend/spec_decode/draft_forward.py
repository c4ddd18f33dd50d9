"""The draft model's forward over its own paged KV, for the steps of one proposal.

A proposal runs a catch-up forward (each sequence's known tokens the draft cache lacks: usually one or
two, a whole prompt for a new sequence) and then ``k - 1`` one-token forwards. With the fast decode step
on (``config.execution.fast_decode``), they go through the target's native op (``NativeDecodeStep.forward``,
``backend/native/csrc/decode_forward.cpp``) built over the draft model and the draft's KV cache: the op
takes each token's position and block-table row, so a catch-up of several tokens per sequence (a new
sequence's whole prompt too) and a one-token step are the same call, and no attention metadata is built
between draft tokens. A catch-up asks the op for each sequence's last token alone (``logit_rows``); where the
op's attention is a per-token loop (a head dim it does not tile, ``NativeDecodeStep.prefills``), catch-ups of
more than ``PER_TOKEN_MAX_TOKENS`` run eagerly. Every step of a draft the op cannot serve runs eagerly
(``native_reason`` says why).

The block tables are fixed for a whole proposal (the proposer reserves every block up front), so
``begin`` writes them once into one ``[num_seqs, width]`` table and every step reuses it.
"""
from __future__ import annotations

import numpy as np
import torch

from backend.attention.metadata import build_attention_metadata
from backend.attention.selector import make_attention_backend
from backend.core.kv_cache import KVCache
from backend.model.llama import LlamaForCausalLM

PER_TOKEN_MAX_TOKENS = 64   # tokens per native call where the op's attention is a per-token loop


def last_token_indices(news: list[int]) -> list[int]:
    """Flat index of each sequence's last new token, when sequence ``j`` has ``news[j]`` tokens in order."""
    return (np.cumsum(news) - 1).tolist()


def token_positions(starts: list[int], news: list[int]) -> np.ndarray:
    """``[sum(news)]`` int64: sequence ``j``'s new tokens sit at ``starts[j] .. starts[j] + news[j] - 1``."""
    if all(n == 1 for n in news):
        return np.asarray(starts, dtype=np.int64)
    return np.concatenate([np.arange(s, s + n, dtype=np.int64) for s, n in zip(starts, news)])


class TokenBuffers:
    """The native op's per-token inputs in preallocated buffers (no tensor built per draft step)."""

    def __init__(self, capacity: int):
        self._allocate(capacity)

    def _allocate(self, capacity: int) -> None:
        self._ids = np.zeros(capacity, dtype=np.int64)
        self._positions = np.zeros(capacity, dtype=np.int64)
        self._rows = np.zeros(capacity, dtype=np.int32)
        self._tensors = [torch.from_numpy(a) for a in (self._ids, self._positions, self._rows)]   # share the arrays
        self._views: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}   # n -> the first n of each

    def fill(self, ids, positions, rows) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Views ``([n] int64 token ids, [n] int64 positions, [n] int32 block-table rows)``, n = len(ids)."""
        n = len(ids)
        if n > len(self._ids):       # a long catch-up (a new sequence's prompt): grow, at least doubling
            self._allocate(max(n, 2 * len(self._ids)))
        self._ids[:n], self._positions[:n], self._rows[:n] = ids, positions, rows
        views = self._views.get(n)
        if views is None:
            views = self._views[n] = tuple(t[:n] for t in self._tensors)
        return views


class DraftForward:
    """``logits(rows, starts, news, ids)``: the draft's logits after the last new token of each ``rows[j]``."""

    def __init__(self, model: LlamaForCausalLM, kv_cache: KVCache, windows=None, native=None,
                 native_reason: str = "off"):
        self.model = model
        self.kv_cache = kv_cache
        self.attn = make_attention_backend(kv_cache, model.config.query_scale, windows=windows)   # the draft's own
                                                                        # sliding windows and query scale
        self.native = native                                            # a NativeDecodeStep over the draft
        self.native_reason = "" if native is not None else native_reason
        self._tables: list[list[int]] = []
        self._table = torch.zeros((0, 0), dtype=torch.int32)           # [num_seqs, width] for the native op
        self._inputs = TokenBuffers(64)                                 # grows for a long catch-up

    @classmethod
    def build(cls, model: LlamaForCausalLM, kv_cache: KVCache, windows, native_step=None) -> DraftForward:
        """Native steps when ``native_step`` (the engine's ``NativeDecodeStep.build``, passed down so that this
        package does not import the engine; None: fast_decode is off) serves this draft, else eager
        (``native_reason`` says why)."""
        if native_step is None:
            return cls(model, kv_cache, windows, None, "off (fast_decode is off)")
        step = native_step(model, kv_cache, windows, scale=None)
        if isinstance(step, str):
            return cls(model, kv_cache, windows, None, f"off ({step})")
        return cls(model, kv_cache, windows, step)

    def describe(self) -> str:
        """``native`` or ``eager`` with the reason, for the load line."""
        return "native" if self.native is not None else f"eager: {self.native_reason}"

    def begin(self, block_tables: list[list[int]]) -> None:
        """The proposal's sequences, in the order ``rows`` refers to them; their tables stay fixed."""
        self._tables = block_tables
        if self.native is None:
            return
        width = max(map(len, block_tables))
        table = np.zeros((len(block_tables), width), dtype=np.int32)
        for i, t in enumerate(block_tables):
            table[i, :len(t)] = t
        self._table = torch.from_numpy(table)

    @torch.inference_mode()
    def logits(self, rows: list[int], starts: list[int], news: list[int], ids: list[int]) -> torch.Tensor:
        """``[len(rows), vocab]``: sequence ``rows[j]`` computes ``news[j]`` tokens (``ids``, in order) from
        position ``starts[j]``, writing their K/V into its blocks."""
        if self.native is not None and (self.native.prefills or len(ids) <= PER_TOKEN_MAX_TOKENS):
            return self._native(rows, starts, news, ids)
        return self._eager(rows, starts, news, ids)

    def _native(self, rows: list[int], starts: list[int], news: list[int], ids: list[int]) -> torch.Tensor:
        one_each = len(ids) == len(rows)
        token_ids, positions, token_rows = self._inputs.fill(
            ids, starts if one_each else token_positions(starts, news), rows if one_each else np.repeat(rows, news))
        picks = None if one_each else torch.tensor(last_token_indices(news), dtype=torch.int64)
        return self.native.forward(token_ids, positions, token_rows, self._table, picks)   # [len(rows), vocab]

    def _eager(self, rows: list[int], starts: list[int], news: list[int], ids: list[int]) -> torch.Tensor:
        meta = build_attention_metadata(starts, news, [self._tables[i] for i in rows], self.kv_cache.block_size,
                                        device=self.kv_cache.device)
        self.attn.prepare(meta)
        input_ids = torch.tensor(ids, dtype=torch.int64, device=self.kv_cache.device)
        hidden = self.model(input_ids, meta.positions, self.attn)                       # [num_tokens, hidden]
        return self.model.compute_logits(hidden[meta.query_start_loc[1:].long() - 1])   # [len(rows), vocab]
