"""The proposer interface: draft tokens for the sequences that speculate this step."""
from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Protocol

import torch

from backend.core.sequence import Sequence


@dataclass
class Proposal:
    """Drafts per sequence (``seq_id -> tokens``, possibly fewer than asked, never empty); for a
    proposer that samples its drafts, the distribution each was drawn from (``q``); and what backs each
    sequence's drafts (``evidence``, a class the adaptive policy learns acceptance for separately: the
    n-gram proposer's matched suffix length; absent: 0)."""

    draft_token_ids: dict[int, list[int]] = field(default_factory=dict)
    draft_probs: dict[int, torch.Tensor] = field(default_factory=dict)   # seq_id -> [num_drafts, vocab] fp32
    evidence: dict[int, int] = field(default_factory=dict)               # seq_id -> evidence class

    def keep(self, seq_id: int, n: int) -> None:
        """Keep the first ``n`` drafts of ``seq_id`` (and their ``q``); at ``n <= 0`` drop its drafts."""
        if n <= 0:
            del self.draft_token_ids[seq_id]
            self.draft_probs.pop(seq_id, None)
            return
        self.draft_token_ids[seq_id] = self.draft_token_ids[seq_id][:n]
        if seq_id in self.draft_probs:
            self.draft_probs[seq_id] = self.draft_probs[seq_id][:n]


class DraftMasks(Protocol):
    """Grammar masks while drafting (``backend.structured_output.draft_runs.DraftSession``)."""

    def bitmask(self, idx: list[int]) -> torch.Tensor | None: ...   # [len(idx), ceil(vocab / 32)] int32

    def advance(self, idx: list[int], tokens: list[int]) -> None: ...

    def close(self) -> None: ...


class DraftGrammar(Protocol):
    """What a proposer may ask of the grammar layer: masks for guided sequences while it drafts."""

    def draft_session(self, seqs: list[Sequence]) -> DraftMasks | None: ...


class Proposer(abc.ABC):
    """Proposes up to ``num_drafts[i]`` tokens after the last known token of ``seqs[i]``.

    Called by the engine after a step's results are applied, for running sequences whose next
    step is a decode. A proposal with point-mass drafts (n-gram) carries no ``draft_probs``. A
    proposer that samples its drafts from a distribution may constrain it with ``grammar`` (the
    speculator cuts every guided proposal at its grammar's first invalid token anyway).
    """

    method: str = ""
    # proposing costs next to nothing (a lookup): the speculator proposes the cap for every decoding
    # sequence first and lets the policy cut each proposal, knowing its evidence
    looks_up: bool = False

    @abc.abstractmethod
    def propose(self, seqs: list[Sequence], num_drafts: list[int], grammar: DraftGrammar | None = None) -> Proposal:
        ...

    def catch_up(self, seqs: list[Sequence], num_drafts: list[int]) -> None:
        """Work that is a one-off per request rather than a cost of each step (a draft model's pass over a new
        sequence's prompt), done before ``propose`` so that the proposal's measured time is what a step costs.
        Nothing by default."""

    def free(self, seq_ids: list[int]) -> None:
        """Forget per-sequence state of sequences that finished or were preempted."""
