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


def fill_positions(
    m: GrammarMatcher,
    drafts: list[int],
    bitmask: torch.Tensor,   # [rows, ceil(vocab / 32)] int32; rows row .. row + len(drafts) are written
    row: int,
) -> None:
    """One row per verified position: row ``row + i`` is what the grammar admits after the accepted
    tokens and ``drafts[:i]``. The matcher advances through the drafts and is rolled back to where it
    was. Rows after an invalid draft, or after one that ends the grammar, stay as they are (all ones):
    verification rejects an invalid draft with certainty, and a token after the end is dropped."""
    m.fill_bitmask(bitmask, row)
    taken = 0
    for k, t in enumerate(drafts):
        if not m.accept_tokens([t]):
            break
        taken += 1
        if m.is_terminated():
            break
        m.fill_bitmask(bitmask, row + k + 1)
    m.rollback(taken)


class BitmaskBuffer:
    """One reused buffer (pinned on CUDA hosts, so the copy to the device is asynchronous), grown by
    doubling; no allocation per step."""

    def __init__(self, vocab_size: int, pin: bool, rows: int = 64):
        self.words = (vocab_size + 31) // 32
        self.pin = pin
        self._buf = self._alloc(rows)

    def _alloc(self, rows: int) -> torch.Tensor:
        t = torch.full((rows, self.words), -1, dtype=torch.int32)
        return t.pin_memory() if self.pin else t

    def rows(self, n: int) -> torch.Tensor:   # [n, words] int32, all ones
        if n > self._buf.shape[0]:
            self._buf = self._alloc(max(n, 2 * self._buf.shape[0]))
        view = self._buf[:n]
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
