"""The engine's speculation driver: after each step, pick each decoding sequence's ``k``, ask the
proposer for drafts, and hand them to the scheduler; learn from every verification.

The engine calls ``after_step(plan, output, seconds, clock)`` once a step's results are applied (``seconds``
on ``clock``, which also times the proposer: the loop thread's CPU time for a step on one thread), and
``release_gone`` after taking aborts from its inbox. Drafts
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
from backend.spec_decode.governor import SpeculationGovernor
from backend.spec_decode.proposer import DraftGrammar, Proposal, Proposer
from backend.spec_decode.step_costs import COLD_STEPS


class DraftChecker(DraftGrammar, Protocol):
    """What the speculator needs of the grammar layer (``StructuredOutputManager``)."""

    def valid_draft_prefix(self, seq: Sequence, drafts: list[int]) -> int:
        """How many leading ``drafts`` the sequence's grammar admits (all of them for unguided ones)."""


def evidence_class(seq: Sequence, evidence: int) -> int:
    """The class the policy learns acceptance for: the proposer's evidence, apart for greedy and sampled requests. A
    sampled request accepts a point-mass draft with probability ``p(d)``, a greedy one only when ``d`` is the argmax:
    pooled, the sampled requests of one workload (n-gram drafts at T=0.8 on ``mixed``) set the engine-wide estimates
    every new greedy request started from, and at batch 32 the greedy requests that followed did not speculate at
    all (0.92x of no speculation, where alone they ran 1.17x)."""
    return 2 * evidence + is_sampled(seq)


def step_kind(plan: SchedulerOutput) -> tuple[bool, bool]:
    """(decode-only: every scheduled sequence computes its last token and its drafts, no prefill chunk; some
    scheduled sequence samples), in one pass over the step."""
    decode_only, sampled = True, False
    for s in plan.scheduled:
        if s.num_new_tokens != 1 + s.num_draft_tokens:
            decode_only = False
        if not sampled and is_sampled(s.seq):
            sampled = True
    return decode_only, sampled


def cut_drafts(drafts: list[int], num_valid: int, sampled_from_q: bool) -> int:
    """How many drafts to verify when only the first ``num_valid`` are grammar-valid: all valid ones,
    plus the first invalid one when the draft was drawn from a distribution (module docstring)."""
    if num_valid >= len(drafts):
        return len(drafts)
    return num_valid + 1 if sampled_from_q else num_valid


class Speculator:
    def __init__(self, proposer: Proposer, max_k: int, adaptive: bool, grammar: DraftChecker | None = None):
        self.proposer = proposer
        self.max_k = max_k
        self.policy = AdaptiveDraftLength(max_k, enabled=adaptive)
        self.governor = SpeculationGovernor(enabled=adaptive)   # whether to speculate at all (governor.py)
        self.grammar = grammar                              # cuts guided drafts; None: no guided requests
        self.draft_probs: dict[int, torch.Tensor] = {}      # seq_id -> [k, vocab] q for the next verification
        self._evidence: dict[int, int] = {}                 # seq_id -> evidence behind the drafts handed over
        self._tracked: dict[int, Sequence] = {}             # sequences the proposer and policy hold state for
        self._last_class: dict[int, int] = {}               # sampled seq_id -> class of its last lookup's drafts
        self.num_cut_draft_tokens = 0                       # drafts dropped by the grammar check, cumulative
        self._cold_steps = 0                                # decode steps left unobserved after a prefill step

    def release_gone(self) -> None:
        """Free the state of sequences no longer running (finished, aborted, preempted: the scheduler takes a
        sequence out of ``running`` as its status leaves RUNNING): draft KV blocks come back at once, not at the
        next step. Called twice a step: the statuses of the few tracked sequences are read, no set of the running
        ones is built."""
        gone = [sid for sid, seq in self._tracked.items() if seq.status is not SequenceStatus.RUNNING]
        if gone:
            self.proposer.free(gone)
            self.policy.free(gone)
            for sid in gone:
                del self._tracked[sid]
                self._last_class.pop(sid, None)

    def seq_max_k(self, seq: Sequence, max_model_len: int) -> int:
        """The most drafts worth proposing for this sequence: its request's own cap, what max_tokens and
        the context leave after the token each step adds anyway."""
        k = self.max_k if seq.params.num_speculative_tokens is None else seq.params.num_speculative_tokens
        return max(0, min(k, seq.params.max_tokens - seq.num_output_tokens - 1,
                          max_model_len - seq.num_tokens - 1))

    def after_step(self, scheduler: Scheduler, plan: SchedulerOutput, output: ModelRunnerOutput,
                   step_seconds: float, clock: Callable[[], float] = time.perf_counter) -> None:
        """Learn from the step's verifications and time (``step_seconds``, measured on ``clock``); propose the
        next step's drafts, timed on the same clock; report a decode step, this call included, to the governor."""
        start = clock()
        decode_only, step_sampled = step_kind(plan)
        if not self.governor.speculating():       # an epoch without speculation (governor.py)
            self._stand_by(scheduler, plan, output)
        else:
            if self.governor.woke():              # speculation resumes after an epoch without: no doze carried over
                self.policy.wake()
            if self.policy.asleep():              # dozing: nothing drafted for a while (adaptive.py)
                self.release_gone()
            else:
                self._learn(plan, output, step_seconds, decode_only, step_sampled)
                self.release_gone()
                self._propose(scheduler, clock)
        if self.governor.enabled and decode_only:  # a decode step (no prefill chunk) counts towards its epochs
            self.governor.observe(len(plan.scheduled), sum(map(len, output.sampled_token_ids)),
                                  step_seconds + clock() - start, step_sampled)

    def _observe_verifications(self, plan: SchedulerOutput, output: ModelRunnerOutput) -> int:
        """The policy observes the step's verifications; the draft tokens verified."""
        drafts = 0
        for sched, tokens in zip(plan.scheduled, output.sampled_token_ids):
            if sched.num_draft_tokens:
                drafts += sched.num_draft_tokens
                sid = sched.seq.seq_id
                self.policy.observe_verify(sid, sched.num_draft_tokens, len(tokens) - 1, self._evidence.get(sid, 0))
        return drafts

    def _learn(self, plan: SchedulerOutput, output: ModelRunnerOutput, step_seconds: float, decode_only: bool,
               step_sampled: bool) -> None:
        """The policy observes the step's verifications and, for a warm decode-only step, its time (``step_sampled``:
        a sequence in it samples)."""
        drafts = self._observe_verifications(plan, output)
        if not decode_only:
            self._cold_steps = COLD_STEPS
        elif self._cold_steps:                    # caches still cold from a prefill: not a cost of speculating
            self._cold_steps -= 1
        elif plan.scheduled:
            self.policy.observe_step(len(plan.scheduled), drafts, step_seconds, step_sampled)

    def _stand_by(self, scheduler: Scheduler, plan: SchedulerOutput, output: ModelRunnerOutput) -> None:
        """A round of an epoch without speculation: propose nothing. The first such step may still verify drafts
        proposed before the epoch began; their acceptance is learnt (their time is not a speculative step's)."""
        if self._evidence:
            self._observe_verifications(plan, output)
            self.draft_probs, self._evidence = {}, {}
        scheduler.spec_counters.num_standby_steps += 1
        self.release_gone()

    def _propose(self, scheduler: Scheduler, clock: Callable[[], float]) -> None:
        self.draft_probs, self._evidence = {}, {}
        decoding = [s for s in scheduler.running if s.num_tokens - s.num_computed_tokens == 1]
        if not decoding or self.policy.plain_step_due(len(decoding), any(map(is_sampled, decoding))):
            return
        proposal = self._proposal(scheduler, decoding, clock)
        self.policy.end_round()
        if not proposal.draft_token_ids:
            return
        if self.grammar is not None:
            self._check_guided([s for s in decoding if s.seq_id in proposal.draft_token_ids], proposal)
        scheduler.update_draft_token_ids(proposal.draft_token_ids)
        self.draft_probs = proposal.draft_probs
        self._evidence = {sid: proposal.evidence.get(sid, 0) for sid in proposal.draft_token_ids}

    def _proposal(self, scheduler: Scheduler, decoding: list[Sequence], clock: Callable[[], float]) -> Proposal:
        """This round's drafts, each cut to the ``k`` the policy chooses for it.

        The policy's ``x(B, k)`` (what a step with drafts costs beyond a plain one) takes in the proposer's time only
        where it depends on the choice: a draft model runs ``k`` forwards for the ``k`` chosen. A greedy sequence is
        looked up every round, whatever the policy chose for it (``k = 0`` included), so its lookup is a cost of
        every round, not of drafting: counted in ``x``, it had made drafts look dearer by the lookup's ~15-25 us
        (with the policy's own cut) against a 4-draft step's ~250 us extra at batch 1, where weak matches sit near
        break-even. A sampled one is looked up only while the policy does not hold it at ``k = 0``
        (``_idle_sampled``): its share of the round's lookup time stays in ``x``."""
        if self.proposer.looks_up:               # a lookup: propose every cap, then the policy cuts by evidence
            t0 = clock()
            looked = [s for s in decoding if not self._idle_sampled(s)]
            proposal = self.proposer.propose(looked, [self.seq_max_k(s, scheduler.max_model_len) for s in looked],
                                             self.grammar)
            self._tracked.update((s.seq_id, s) for s in looked)     # the proposer indexed them
            for seq in looked:
                if seq.seq_id in proposal.draft_token_ids:
                    cls = proposal.evidence[seq.seq_id] = evidence_class(seq, proposal.evidence.get(seq.seq_id, 0))
                    if is_sampled(seq):
                        self._last_class[seq.seq_id] = cls
            self._cut_by_policy(proposal, len(decoding))
            sampled = sum(map(is_sampled, looked))
            seconds = (clock() - t0) * sampled / len(looked) if sampled else 0.0   # the sampled ones' share
        else:                                    # drafting costs: the policy chooses first
            seqs, ks = self._choose(scheduler, decoding)
            if not seqs:
                return Proposal()
            self._tracked.update((s.seq_id, s) for s in seqs)
            self.proposer.catch_up(seqs, ks)     # one-offs per request (a draft's prompt) are not a step's cost
            t0 = clock()
            proposal = self.proposer.propose(seqs, ks, self.grammar)
            for seq in seqs:
                proposal.evidence[seq.seq_id] = evidence_class(seq, proposal.evidence.get(seq.seq_id, 0))
            seconds = clock() - t0
        self.policy.observe_draft(seconds, sum(len(d) for d in proposal.draft_token_ids.values()))
        return proposal

    def _idle_sampled(self, seq: Sequence) -> bool:
        """A sampled sequence whose last lookup's class the policy holds at ``k = 0`` between probes is not looked up
        this round (the round counts towards its probe, as choosing would count it). At batch 32 of sampled
        requests the lookups cost ~170 us a step, ~3% of it, while the policy drafted almost nothing. Greedy
        sequences are always looked up: a longer match there is worth drafting at once."""
        cls = self._last_class.get(seq.seq_id)
        return cls is not None and self.policy.idle(seq.seq_id, cls)

    def _choose(self, scheduler: Scheduler, decoding: list[Sequence]) -> tuple[list[Sequence], list[int]]:
        """The sequences that draft this step and their ``k`` (proposers whose drafting costs)."""
        seqs, ks = [], []
        policy = self.policy
        for seq in decoding:
            cls = evidence_class(seq, 0)
            if policy.idle(seq.seq_id, cls):               # at k = 0 between probes: nothing to decide
                continue
            k = policy.choose(seq.seq_id, self.seq_max_k(seq, scheduler.max_model_len), len(decoding), cls)
            if k > 0:
                seqs.append(seq)
                ks.append(k)
        return seqs, ks

    def _cut_by_policy(self, proposal: Proposal, num_decoding: int) -> None:
        """Keep of each looked-up proposal the ``k`` the policy chooses for its evidence (none at ``k = 0``)."""
        for sid, drafts in list(proposal.draft_token_ids.items()):
            k = self.policy.choose(sid, len(drafts), num_decoding, proposal.evidence.get(sid, 0))
            if k < len(drafts):
                proposal.keep(sid, k)

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
