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
