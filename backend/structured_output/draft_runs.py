"""A grammar matcher over speculative runs: how much of a proposal the grammar admits, and accepting
a verified run (accepted drafts, then the recovered or bonus token).

Two rules make guided speculation give the same output as guided decoding without it:
- a run that ends the grammar (EOS accepted) may carry one more token, sampled from the unconstrained
  row after the end: the matcher stops at the end and the scheduler drops that token;
- with jump-forward, the engine appends the forced tokens after every sampled token where the grammar
  forces what follows, instead of sampling there. So drafts end at such a state
  (``stop_where_forced``), and a run whose last accepted draft reaches one loses the token sampled
  after it (``RunResult.LAST_DROPPED``): the engine appends the forced tokens there.
"""
from __future__ import annotations

import enum
from collections.abc import Callable

import torch

from backend.structured_output.interface import GrammarMatcher


class RunResult(enum.Enum):
    ACCEPTED = "accepted"           # the matcher advanced through the run (up to the grammar's end)
    LAST_DROPPED = "last_dropped"   # through all but the last token, which the caller drops
    REJECTED = "rejected"           # a token the grammar forbids; the matcher is unchanged


def forced_here(m: GrammarMatcher) -> bool:
    """The grammar admits exactly one continuation here (jump-forward would append it)."""
    return not m.is_terminated() and bool(m.jump_forward_tokens())


def valid_prefix(m: GrammarMatcher, drafts: list[int], stop_where_forced: bool) -> int:
    """How many leading ``drafts`` to keep: those the grammar admits, up to the first one after which
    the grammar forces what follows when ``stop_where_forced``. The matcher is left unchanged."""
    if not stop_where_forced:
        return m.validate_tokens(drafts)
    n = 0
    for t in drafts:
        if m.is_terminated() or not m.accept_tokens([t]):
            break
        n += 1
        if forced_here(m):
            break
    m.rollback(n)
    return n


def accept_run(m: GrammarMatcher, tokens: list[int], drop_where_forced: bool) -> RunResult:
    """Advance the matcher through one verified run (module docstring for the two rules)."""
    if drop_where_forced and len(tokens) > 1:
        head = tokens[:-1]
        if m.accept_tokens(head):
            if forced_here(m):
                return RunResult.LAST_DROPPED
            m.rollback(len(head))
    if m.accept_tokens(tokens):
        return RunResult.ACCEPTED
    n = m.validate_tokens(tokens)          # stops at the grammar's end
    if n and m.accept_tokens(tokens[:n]):
        if m.is_terminated():
            return RunResult.ACCEPTED
        m.rollback(n)
    return RunResult.REJECTED


class DraftSession:
    """Grammar masks while a draft model drafts (one proposal): each guided sequence's state after the
    drafts drawn so far, so that its drafts are drawn from the draft's *constrained* distribution and are
    valid by construction (the rejection rule is exact for any ``q`` it is given). ``close`` rolls every
    matcher back to the verified state."""

    def __init__(self, matchers: list[GrammarMatcher | None],   # per proposing sequence; None: unguided
                 fill_batch: Callable[[list[GrammarMatcher], torch.Tensor, list[int]], None], words: int):
        self.matchers = matchers
        self._fill = fill_batch
        self._words = words
        self._taken = [0] * len(matchers)
        self._live = [m is not None and not m.is_terminated() for m in matchers]

    def bitmask(self, idx: list[int]) -> torch.Tensor | None:   # [len(idx), words] int32, or None: no mask
        """Row ``j``: what the grammar of sequence ``idx[j]`` admits next (all ones for unguided ones and
        for a grammar that has ended: what is drafted after the end is cut before verification)."""
        live = [j for j, i in enumerate(idx) if self._live[i]]
        if not live:
            return None
        bitmask = torch.full((len(idx), self._words), -1, dtype=torch.int32)
        self._fill([self.matchers[idx[j]] for j in live], bitmask, live)
        return bitmask

    def advance(self, idx: list[int], tokens: list[int]) -> None:
        """Sequence ``idx[j]`` drafted ``tokens[j]``."""
        for i, t in zip(idx, tokens):
            if not self._live[i]:
                continue
            m = self.matchers[i]
            if m.accept_tokens([t]):
                self._taken[i] += 1
                self._live[i] = not m.is_terminated()
            else:
                self._live[i] = False

    def close(self) -> None:
        for m, n in zip(self.matchers, self._taken):
            if n:
                m.rollback(n)
