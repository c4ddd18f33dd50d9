"""The draft-length policy interface: how many drafts each decoding sequence proposes next step.

The speculator (``speculator.py``) calls four methods, in any order a step needs:

- ``choose(num_decoding, candidates)``: once per proposal round, the ``k`` of every candidate (a decoding
  sequence, its evidence class and its own cap ``k_max``); ``0`` drafts nothing;
- ``observe(step)``: once per engine step, what it verified and what it cost (``StepRecord``);
- ``idle(seq_id)``: whether a sequence would be held at ``k = 0`` this round, so a lookup for it can be skipped;
- ``free(seq_ids)``: forget sequences that left the running set.

``FixedK`` always proposes the cap, as vLLM ships it; ``adaptive.AdaptiveDraftLength`` chooses ``k`` from
measured acceptance and step costs.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class Candidate:
    """A decoding sequence the policy chooses ``k`` for: drafts backed by evidence class ``cls`` (the
    speculator's ``evidence_class``), at most ``k_max`` of them."""

    seq_id: int
    cls: int
    k_max: int


@dataclass(frozen=True)
class Verified:
    """One sequence's verification: ``num_drafts`` drafts of class ``cls``, the first ``num_accepted`` accepted."""

    seq_id: int
    cls: int
    num_drafts: int
    num_accepted: int


@dataclass(frozen=True)
class StepRecord:
    """One engine step: ``num_seqs`` scheduled sequences, ``seconds`` on the engine's step clock (the proposer's
    time for the drafts it verified included), whether every sequence decoded (no prefill chunk), and the
    verifications."""

    num_seqs: int
    seconds: float
    decode_only: bool
    verified: list[Verified] = field(default_factory=list)


class DraftLengthPolicy(Protocol):
    def choose(self, num_decoding: int, candidates: list[Candidate]) -> list[int]:
        """The ``k`` of each candidate, in order, each in ``[0, candidate.k_max]``."""

    def observe(self, step: StepRecord) -> None:
        """Learn from one engine step."""

    def idle(self, seq_id: int) -> bool:
        """The sequence sits at ``k = 0`` this round whatever its drafts: proposing for it can be skipped."""

    def free(self, seq_ids: list[int]) -> None:
        """Forget the state of these sequences."""


class FixedK:
    """Every candidate proposes its cap; nothing is learnt."""

    def choose(self, num_decoding: int, candidates: list[Candidate]) -> list[int]:
        return [c.k_max for c in candidates]

    def observe(self, step: StepRecord) -> None:
        pass

    def idle(self, seq_id: int) -> bool:
        return False

    def free(self, seq_ids: list[int]) -> None:
        pass
