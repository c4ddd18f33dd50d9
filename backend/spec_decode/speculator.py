"""The engine's speculation driver: after each step, pick each decoding sequence's ``k``, ask the
proposer for drafts, and hand them to the scheduler; learn from every verification.

The engine calls ``after_step(scheduler, plan, output, seconds, clock)`` once a step's results are applied
(``seconds`` on ``clock``, which also times the proposer: the loop thread's CPU time for a step on one thread),
and ``release_gone`` after taking aborts from its inbox. How many drafts each sequence proposes is the policy's
choice (``policy.py``: ``FixedK``, or ``adaptive.py`` when ``speculative_adaptive``). Drafts
enter the scheduler only through ``Scheduler.update_draft_token_ids``; the draft distributions
``q`` (draft model, sampled requests) are kept here until the next step's verification asks for
them (``draft_probs``).

Guided requests (constrained decoding) speculate too: each proposal is checked against the
sequence's grammar (``DraftChecker.valid_draft_prefix``) and cut at its first invalid token, so
the target never computes positions the grammar has already ruled out. A draft drawn from a real
distribution ``q`` (the draft model, sampled requests) keeps its first invalid token: verification
rejects it with certainty (the grammar mask makes ``p`` zero there) and draws the next token from
``norm(max(0, p - q))``, exactly as without the cut. Cutting it too would draw from ``p`` instead
and bias the output towards tokens ``q`` favours. A point-mass draft (n-gram, greedy) loses
nothing by the cut: its residual ``max(0, p - onehot)`` is ``p`` where ``p`` is zero at the draft.
The draft model drafts guided sequences under their grammar mask (``grammar`` is passed to the
proposer), so its proposals need a cut only after an EOS.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

import torch

from backend.core.plan import ModelRunnerOutput, SchedulerOutput
from backend.core.scheduler import Scheduler
from backend.core.sequence import Sequence, SequenceStatus
from backend.sampling.batch import is_sampled
from backend.spec_decode.adaptive import AdaptiveDraftLength
from backend.spec_decode.policy import Candidate, DraftLengthPolicy, FixedK, StepRecord, Verified
from backend.spec_decode.proposer import DraftGrammar, Proposal, Proposer


class DraftChecker(DraftGrammar, Protocol):
    """What the speculator needs of the grammar layer (``StructuredOutputManager``)."""

    def valid_draft_prefix(self, seq: Sequence, drafts: list[int]) -> int:
        """How many leading ``drafts`` the sequence's grammar admits (all of them for unguided ones)."""


def evidence_class(seq: Sequence, evidence: int) -> int:
    """The class the policy learns acceptance for: the proposer's evidence, apart for greedy and sampled requests. A
    sampled request accepts a point-mass draft with probability ``p(d)``, a greedy one only when ``d`` is the argmax,
    so pooled, a sampled workload's low acceptance would hold the greedy requests that follow it at ``k = 0``."""
    return 2 * evidence + is_sampled(seq)


def cut_drafts(drafts: list[int], num_valid: int, sampled_from_q: bool) -> int:
    """How many drafts to verify when only the first ``num_valid`` are grammar-valid: all valid ones,
    plus the first invalid one when the draft was drawn from a distribution (module docstring)."""
    if num_valid >= len(drafts):
        return len(drafts)
    return num_valid + 1 if sampled_from_q else num_valid


class Speculator:
    """Drives a proposer under a ``DraftLengthPolicy`` (``policy.py``): ``FixedK`` or ``AdaptiveDraftLength``."""

    def __init__(self, proposer: Proposer, max_k: int, adaptive: bool, grammar: DraftChecker | None = None,
                 policy: DraftLengthPolicy | None = None):
        self.proposer = proposer
        self.max_k = max_k
        self.policy: DraftLengthPolicy = policy if policy is not None else \
            AdaptiveDraftLength(max_k) if adaptive else FixedK()
        self.grammar = grammar                              # cuts guided drafts; None: no guided requests
        self.draft_probs: dict[int, torch.Tensor] = {}      # seq_id -> [k, vocab] q for the next verification
        self._evidence: dict[int, int] = {}                 # seq_id -> class of the drafts handed over
        self._tracked: dict[int, Sequence] = {}             # sequences the proposer and policy hold state for
        self._draft_seconds = 0.0                           # the proposer's time for the drafts handed over
        self.num_cut_draft_tokens = 0                       # drafts dropped by the grammar check, cumulative

    def release_gone(self) -> None:
        """Free the state of sequences no longer running (finished, aborted, preempted: the scheduler takes a
        sequence out of ``running`` as its status leaves RUNNING): draft KV blocks come back at once, not at the
        next step. The statuses of the few tracked sequences are read, no set of the running ones is built."""
        gone = [sid for sid, seq in self._tracked.items() if seq.status is not SequenceStatus.RUNNING]
        if gone:
            self.proposer.free(gone)
            self.policy.free(gone)
            for sid in gone:
                del self._tracked[sid]

    def seq_max_k(self, seq: Sequence, max_model_len: int) -> int:
        """The most drafts worth proposing for this sequence: its request's own cap, what max_tokens and
        the context leave after the token each step adds anyway."""
        k = self.max_k if seq.params.num_speculative_tokens is None else seq.params.num_speculative_tokens
        return max(0, min(k, seq.params.max_tokens - seq.num_output_tokens - 1,
                          max_model_len - seq.num_tokens - 1))

    def after_step(self, scheduler: Scheduler, plan: SchedulerOutput, output: ModelRunnerOutput,
                   step_seconds: float, clock: Callable[[], float] = time.perf_counter) -> None:
        """Learn from the step's verifications and time (``step_seconds``, measured on ``clock``, which times the
        proposer too); propose the next step's drafts."""
        self.policy.observe(self._record(plan, output, step_seconds + self._draft_seconds))
        self.release_gone()
        self._propose(scheduler, clock)

    def _record(self, plan: SchedulerOutput, output: ModelRunnerOutput, seconds: float) -> StepRecord:
        decode_only = all(s.num_new_tokens == 1 + s.num_draft_tokens for s in plan.scheduled)
        verified = [Verified(s.seq.seq_id, self._evidence.get(s.seq.seq_id, 0), s.num_draft_tokens, len(t) - 1)
                    for s, t in zip(plan.scheduled, output.sampled_token_ids) if s.num_draft_tokens]
        return StepRecord(len(plan.scheduled), seconds, decode_only, verified)

    def _propose(self, scheduler: Scheduler, clock: Callable[[], float]) -> None:
        self.draft_probs, self._evidence, self._draft_seconds = {}, {}, 0.0
        decoding = [s for s in scheduler.running if s.num_tokens - s.num_computed_tokens == 1]
        if not decoding:
            return
        proposal = self._proposal(scheduler, decoding, clock)
        if not proposal.draft_token_ids:
            scheduler.spec_counters.num_standby_steps += 1   # a decode step the policy drafts nothing for
            return
        if self.grammar is not None:
            self._check_guided([s for s in decoding if s.seq_id in proposal.draft_token_ids], proposal)
        scheduler.update_draft_token_ids(proposal.draft_token_ids)
        self.draft_probs = proposal.draft_probs
        self._evidence = {sid: proposal.evidence.get(sid, 0) for sid in proposal.draft_token_ids}

    def _proposal(self, scheduler: Scheduler, decoding: list[Sequence], clock: Callable[[], float]) -> Proposal:
        """This round's drafts, each cut to the ``k`` the policy chooses for it.

        A lookup (n-gram) costs next to nothing: every decoding sequence is looked up for its cap (but a sampled
        one the policy holds at ``k = 0``) and the policy cuts each proposal knowing its evidence; the lookup is a
        cost of every round, not of drafting, so it is not timed. A draft model costs ``k`` forwards: the policy
        chooses first, and the proposer's time joins the cost of the step that verifies its drafts."""
        caps = {s.seq_id: self.seq_max_k(s, scheduler.max_model_len) for s in decoding}
        if self.proposer.looks_up:
            looked = [s for s in decoding if not (is_sampled(s) and self.policy.idle(s.seq_id))]
            proposal = self.proposer.propose(looked, [caps[s.seq_id] for s in looked], self.grammar)
            self._tracked.update((s.seq_id, s) for s in looked)     # the proposer indexed them
            by_id = {s.seq_id: s for s in looked}
            for sid in proposal.draft_token_ids:
                proposal.evidence[sid] = evidence_class(by_id[sid], proposal.evidence.get(sid, 0))
            sids = list(proposal.draft_token_ids)
            cands = [Candidate(sid, proposal.evidence[sid], len(proposal.draft_token_ids[sid])) for sid in sids]
            for sid, k in zip(sids, self.policy.choose(len(decoding), cands)):
                if k < len(proposal.draft_token_ids[sid]):
                    proposal.keep(sid, k)
            return proposal
        cands = [Candidate(s.seq_id, evidence_class(s, 0), caps[s.seq_id]) for s in decoding if caps[s.seq_id]]
        ks = self.policy.choose(len(decoding), cands)
        by_id = {s.seq_id: s for s in decoding}
        chosen = [(by_id[c.seq_id], k) for c, k in zip(cands, ks) if k > 0]
        if not chosen:
            return Proposal()
        seqs, num = [s for s, _ in chosen], [k for _, k in chosen]
        self._tracked.update((s.seq_id, s) for s in seqs)
        self.proposer.catch_up(seqs, num)        # one-offs per request (a draft's prompt) are not a step's cost
        t0 = clock()
        proposal = self.proposer.propose(seqs, num, self.grammar)
        self._draft_seconds = clock() - t0
        for seq in seqs:
            proposal.evidence[seq.seq_id] = evidence_class(seq, proposal.evidence.get(seq.seq_id, 0))
        return proposal

    def _check_guided(self, seqs: list[Sequence], proposal: Proposal) -> None:
        """Cut each guided sequence's drafts at its grammar's first invalid token (``cut_drafts``)."""
        for seq in seqs:
            drafts = proposal.draft_token_ids.get(seq.seq_id)
            if not drafts or seq.params.guide is None:
                continue
            q = proposal.draft_probs.get(seq.seq_id)
            keep = cut_drafts(drafts, self.grammar.valid_draft_prefix(seq, drafts), q is not None)
            if keep == len(drafts):
                continue
            self.num_cut_draft_tokens += len(drafts) - keep
            proposal.keep(seq.seq_id, keep)
