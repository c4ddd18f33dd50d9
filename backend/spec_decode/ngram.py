"""N-gram prompt lookup: propose the tokens that followed the latest earlier occurrence of the
sequence's last ``n`` tokens in its own prompt + output (the longest ``n`` in ``ngram_min..ngram_max``
first, the latest occurrence among those).

Vectorised with numpy over the whole context (no Python loop over positions); each sequence's
context is kept as a growing int32 array, so a step converts only its new tokens.
"""
from __future__ import annotations

import numpy as np

from backend.core.sequence import Sequence
from backend.spec_decode.proposer import DraftGrammar, Proposal, Proposer


def ngram_lookup(
    context: np.ndarray,   # [num_tokens] int
    n_min: int,
    n_max: int,
    k: int,
) -> np.ndarray:           # [<= k] the continuation of the latest earlier match of the longest suffix
    """Draft tokens by prompt lookup; empty when no suffix of length ``n_min..n_max`` recurs.

    One pass finds the earlier positions holding the last token; the longer suffixes are then
    checked on those candidates only, so the cost is one comparison over the context plus
    ``n_max`` small ones.
    """
    length = len(context)
    if length < n_min + 1:
        return context[:0]
    ends = np.flatnonzero(context[:length - 1] == context[length - 1])   # earlier positions ending a 1-gram match
    if ends.size == 0:
        return context[:0]
    match_len = np.ones(ends.size, dtype=np.int64)                     # suffix length matched at each candidate
    alive = np.ones(ends.size, dtype=bool)
    for j in range(1, min(n_max, length - 1)):
        pos = ends - j
        ok = alive & (pos >= 0)
        ok[ok] = context[pos[ok]] == context[length - 1 - j]
        match_len += ok
        alive = ok
        if not alive.any():
            break
    best = int(match_len.max())
    if best < n_min:
        return context[:0]
    start = int(ends[np.flatnonzero(match_len == best)[-1]]) + 1        # the token after the latest longest match
    return context[start:start + k]


class NgramProposer(Proposer):
    method = "ngram"

    def __init__(self, n_min: int, n_max: int):
        self.n_min, self.n_max = n_min, n_max
        self._contexts: dict[int, tuple[np.ndarray, int]] = {}   # seq_id -> (buffer, valid length)

    def _context(self, seq: Sequence) -> np.ndarray:
        buf, n = self._contexts.get(seq.seq_id, (None, 0))
        total = seq.num_tokens
        if buf is None or n > total:
            buf, n = np.empty(max(64, 2 * total), dtype=np.int32), 0
        if total > len(buf):
            grown = np.empty(2 * total, dtype=np.int32)
            grown[:n] = buf[:n]
            buf = grown
        if n < total:
            p = seq.num_prompt_tokens
            if n < p:
                buf[n:p] = seq.prompt_token_ids[n:]
                n = p
            buf[n:total] = seq.output_token_ids[n - p:]
        self._contexts[seq.seq_id] = (buf, total)
        return buf[:total]

    def propose(self, seqs: list[Sequence], num_drafts: list[int], grammar: DraftGrammar | None = None) -> Proposal:
        """Prompt lookup ignores ``grammar``: its drafts are cut by the speculator instead."""
        out = Proposal()
        for seq, k in zip(seqs, num_drafts):
            if k <= 0:
                continue
            drafts = ngram_lookup(self._context(seq), self.n_min, self.n_max, k)
            if drafts.size:
                out.draft_token_ids[seq.seq_id] = drafts.tolist()
        return out

    def free(self, seq_ids: list[int]) -> None:
        for seq_id in seq_ids:
            self._contexts.pop(seq_id, None)
