"""The step's grammar bitmask: which rows it has, the buffer it lives in, how one sequence's verified
positions are filled, and a fill running on a worker thread while the forward runs.

Layout (xgrammar's): ``[rows, ceil(vocab / 32)]`` int32 on the CPU, bit ``j`` of word ``w`` allows
token ``32 * w + j``; a row of all ones (-1) is unconstrained.
"""
from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future

import torch

from backend.core.plan import SchedulerOutput
from backend.structured_output.interface import GrammarMatcher


def sampled_rows(plan: SchedulerOutput) -> list[int]:
    """The plan index of each row the runner samples (``ForwardOutput.rows``): one per sequence whose
    chunk samples, ``1 + drafts`` consecutive ones for a sequence verifying drafts."""
    return [i for i, s in enumerate(plan.scheduled) if s.sample for _ in range(s.num_draft_tokens + 1)]


def fill_verified_positions(
    fill_batch: Callable[[list[GrammarMatcher], torch.Tensor, list[int]], None],   # a backend's fill_bitmasks
    entries: list[tuple[GrammarMatcher, int, list[int]]],   # per guided sequence: matcher, first row, drafts
    bitmask: torch.Tensor,   # [rows, ceil(vocab / 32)] int32
) -> None:
    """One row per verified position: row ``first + i`` of a sequence is what its grammar admits after the
    accepted tokens and ``drafts[:i]``. Level by level, one batched fill per level: level ``i`` holds the
    sequences whose first ``i`` drafts the grammar admitted without ending; each matcher then takes its
    next draft. Every matcher is rolled back to where it was. Rows after an invalid draft, or after one
    that ends the grammar, stay as they are (all ones): verification rejects an invalid draft with
    certainty, and a token after the end is dropped."""
    taken = [0] * len(entries)
    live = list(range(len(entries)))
    level = 0
    while live:
        fill_batch([entries[e][0] for e in live], bitmask, [entries[e][1] + level for e in live])
        nxt = []
        for e in live:
            m, _, drafts = entries[e]
            if level < len(drafts) and m.accept_tokens([drafts[level]]):
                taken[e] += 1
                if not m.is_terminated():
                    nxt.append(e)
        live, level = nxt, level + 1
    for (m, _, _), n in zip(entries, taken):
        m.rollback(n)


class BitmaskBuffer:
    """One reused buffer (pinned on CUDA hosts, so the copy to the device is asynchronous), grown by
    doubling; no allocation per step, and the view of its first ``n`` rows is made once per ``n`` (a
    slice costs about as much as a one-row fill)."""

    def __init__(self, vocab_size: int, pin: bool, rows: int = 64):
        self.words = (vocab_size + 31) // 32
        self.pin = pin
        self._buf = self._alloc(rows)
        self._views: dict[int, torch.Tensor] = {}   # n -> self._buf[:n]

    def _alloc(self, rows: int) -> torch.Tensor:
        t = torch.full((rows, self.words), -1, dtype=torch.int32)
        return t.pin_memory() if self.pin else t

    def rows(self, n: int, reset: bool = True) -> torch.Tensor:   # [n, words] int32
        """The first ``n`` rows: all ones, or as the last step left them when not ``reset`` (the caller
        overwrites every row)."""
        view = self._views.get(n)
        if view is None:
            if n > self._buf.shape[0]:
                self._buf = self._alloc(max(n, 2 * self._buf.shape[0]))
                self._views.clear()
            view = self._views[n] = self._buf[:n]
        if reset:
            view.fill_(-1)
        return view


class PendingFill:
    """The step's bitmask: being filled on the worker thread (``future``), to be filled when asked
    (``deferred``, on the caller's thread after the forward), or ``PendingFill(None)``: no guided row."""

    def __init__(self, rows: list[int] | None, future: Future | None = None,
                 deferred: Callable[[], torch.Tensor | None] | None = None):
        self.rows = rows
        self._future = future
        self._deferred = deferred

    def result(self, rows: list[int]) -> torch.Tensor | None:
        """The bitmask; ``rows`` are the forward's sampled rows, which must be the ones filled."""
        if self.rows is None:
            return None
        bitmask = self._future.result() if self._future is not None else None   # the worker is done with it
        if rows != self.rows:
            raise RuntimeError(f"the grammar bitmask was filled for rows {self.rows}, the forward sampled {rows}")
        return bitmask if self._future is not None else self._deferred()
