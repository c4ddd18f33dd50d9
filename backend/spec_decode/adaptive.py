"""Adaptive draft length: choose each request's ``k`` from what speculation measurably buys.

For a sequence with per-position acceptance estimates ``a_1..a_K`` ("draft ``j`` accepted, given
``1..j-1`` were"), proposing ``k`` drafts yields ``1 + E(k)`` tokens per step,
``E(k) = sum_{i<=k} prod_{j<=i} a_j``. With ``B`` decoding sequences, its share of a plain decode
step is ``t(B) / B``, and speculating with ``k`` drafts adds ``x(B, k)`` seconds per speculating
sequence: everything a step with drafts costs beyond a plain one (a draft model's forwards, the extra
tokens in the forward, the rejection sampling; a greedy sequence's n-gram lookup is left out, as it runs every round
whatever ``k`` is chosen, a sampled one's stays in, backend/spec_decode/speculator.py), divided by the sequences
that verified. The chosen
``k`` maximises expected tokens per second,

    (1 + E(k)) / (t(B) / B + x(B, k)),

and ``k > 0`` only when that beats plain decoding by ``MARGIN`` (none: the probes, the governor and the
measured costs are the safety; a 5% margin had cost 1-10% in 7 of 8 cells of ``repeat`` and ``mixed`` at
batch 1 and 8, greedy and sampled, once sampled verification was cheap). ``t`` and ``x`` are measured per
batch-size bucket and draft length (``StepCosts``, backend/spec_decode/step_costs.py), apart for steps with a
sampled request (``sampled_costs``) and steps of greedy ones only (``costs``): a sampled verification draws
from the target's filtered distributions, a greedy one takes an argmax, and costs measured in a sampled
workload had kept a greedy one that followed it at batch 32 from speculating at all (0.97x of no
speculation where a fixed ``k`` ran 1.15x).

Acceptance is learnt per position and evidence class, engine-wide and per sequence, and a sequence's
estimate is its own mean pulled towards the engine-wide one, which counts as ``SEQ_PRIOR_WEIGHT``
observations (``shrunk_acceptance``): a new sequence starts from what the engine has seen, so a workload
where drafts fail stops paying for them from one request to the next instead of relearning it in every
request, and one rejection does not outweigh the engine's evidence. Before, a new sequence copied the
engine-wide estimate as a prior worth one observation and then learnt alone with a floor weight of 0.25:
a single rejection at draft 3 of a copying request (drafts accepted ~98% of the time) halved that
position's estimate, the policy then drafted 2 where 4 paid, and only a probe now and then could undo it
(greedy ``repeat`` requests at batch 1 ran 10-15% more steps than with a fixed ``k``). A sequence's own
mean is an average while it has few observations, then an exponential one of weight ``MIN_WEIGHT``. The
engine-wide estimates are learnt the same way from an optimistic prior worth ``PRIOR_WEIGHT``
observations (an average at first, then weight ``GLOBAL_DECAY``, a memory of some 20 verifications): the
prior is gone after a handful of verifications, a change of workload (greedy code, then sampled prose) is
followed within a request, and the last few verifications alone do not set every sequence's estimate (at
weight 0.2 a 4-token match's first-draft estimate swung between 0.73 and 0.98 on one workload). A sequence at
``k = 0`` is re-probed with its full ``k`` (one probe then measures every position: a repetitive request among unrepetitive
ones is recognised from one probe) after ``PROBE_EVERY`` steps, the interval doubling (up to
``PROBE_MAX``) while probes keep failing and never shorter than what keeps all sequences' probes within
``PROBE_BUDGET`` of the plain step time (at large batches a probing sequence costs nearly a whole share
of the step; a draft model's probe costs ``k`` draft forwards), so a change in acceptance is noticed at
a bounded cost. A sequence drafting fewer than its cap is probed the same way with its full ``k`` (a *deeper*
probe): positions past its ``k`` are observed only when drafted, and one early rejection at draft 4 had held
``k`` at 3 for the rest of the request while drafts 1-3 were accepted ~100% of the time. A probe's cost there
is its expected loss, ``x(B, k)`` less the tokens the sequence's acceptance says it yields: a sequence just
below break-even (one early rejection in a repetitive request) is probed again after ``PROBE_EVERY`` steps,
not after the whole request. Between probes a sequence at ``k = 0`` costs the policy one counter increment per
step: nothing it could learn from has happened since it chose ``k = 0`` (no verification), and with the fast
decode step (~0.5 ms at batch 1) re-deciding every step would itself cost a few percent.

A choice of the sequence's full ``k`` made on merit stands for up to ``REUSE_ROUNDS`` rounds while every draft
verified since was accepted and the batch size and the kind of step (sampled or greedy) are unchanged: higher
acceptance only ever favours longer drafts (``E(k) - E(k')`` grows with every ``a_j`` for ``k > k'``), so the
decision could change only through the step costs (one new observation per step in a window of ``WINDOW``) or,
at larger batches, through other sequences' verifications moving the engine-wide estimates, and those are looked
at again every ``REUSE_ROUNDS`` rounds. On greedy ``repeat`` at batch 1 the full decision cost ~14 us a round in
the engine (cold caches after the forward), ~2.5% of a verify step and the whole difference between this
policy's and a fixed ``k``'s per-step work; with the reuse ``choose`` averages ~7 us there (a full decision still
follows every rejection). End to end the gain is inside the noise of a one-thread A/B (docs/benchmarks.md,
session 12). A rejection, a deeper probe or a choice below the cap is never reused.

Acceptance depends on what backs a proposal as much as on the request: an n-gram lookup that matched the
last 4 tokens of the context is accepted far more often than one that matched only the last token
(demo target, greedy: 63-82% against 22%; sampled at 0.8: 14-31% against 7%). So every estimate above,
per sequence and engine-wide, is kept per *evidence* class, an integer the proposer attaches to its
drafts (``Proposal.evidence``: the matched suffix length for n-gram, 0 for proposers without one): a
request speculates on its strong matches and skips its weak ones. A cheap proposer (``Proposer.looks_up``)
proposes before the policy chooses, so the evidence is known when ``k`` is; a sequence at ``k = 0`` is
idle per evidence class.

When no sequence has drafted on merit (a ``k > 0`` because drafts pay; probes and re-measurements are
measurements, not merit) for ``DOZE_AFTER`` rounds the policy dozes (``asleep``): the speculator skips
its per-step work entirely (the lookups and the policy's bookkeeping: ~26 us of Python at batch 1, ~8% of a
batch-1 step of the demo target) in all but one round of ``DOZE_EVERY``, until a sequence drafts again. The
awake rounds decide as usual (a strong n-gram match is still taken within ``DOZE_EVERY`` rounds), and the
probes of sequences at ``k = 0`` count awake rounds, so dozing also spaces them out. A probe does not wake the
policy: with many sequences (or evidence classes) at ``k = 0``, one probe or another is due every few rounds,
and each would have bought ``DOZE_AFTER`` wakeful rounds (sampled requests at batch 1 lost 5-10% to them); a
probe that finds drafts accepted raises the acceptance, and the next awake round then drafts on merit.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from backend.core.buckets import bucket
from backend.spec_decode.step_costs import StepCosts, plain_interval

PRIOR_ACCEPTANCE = 0.9     # optimistic engine-wide start: the first requests speculate with the full k
PRIOR_WEIGHT = 1.0         # pseudo-observations behind the engine-wide estimates' optimistic start
SEQ_PRIOR_WEIGHT = 4.0     # pseudo-observations behind a new sequence's start (the engine-wide estimate)
MIN_WEIGHT = 0.1           # weight of a new acceptance observation once a position has a few
GLOBAL_DECAY = 0.05        # weight of a new observation in the engine-wide estimates, once they have a few
MARGIN = 0.0               # speculate only when expected tokens/s beats plain decoding by this fraction
PROBE_EVERY = 16           # steps at k = 0 before a probe with the full k
PROBE_MAX = 128            # the probe interval doubles up to this while probes fail
PROBE_BUDGET = 0.02        # and is at least long enough for all probes to cost <= 2% of the plain step time
DOZE_AFTER = 16            # rounds in a row in which no sequence drafted before the policy dozes
DOZE_EVERY = 4             # while dozing, one round in this many is awake
FORGET_AFTER = 512         # proposal rounds without a choice for a sequence before its state is dropped
REUSE_ROUNDS = 8           # rounds a choice of the full k stands while every draft since has been accepted


def expected_accepted(acceptance: list[float], k: int) -> float:
    """``E(k) = sum_{i<=k} prod_{j<=i} a_j``: expected accepted drafts when proposing ``k``."""
    total, run = 0.0, 1.0
    for a in acceptance[:k]:
        run *= a
        total += run
    return total


def cap_unobserved(acceptance: list[float], observations: list[int], prior: float = PRIOR_ACCEPTANCE) -> None:
    """A position never observed is taken at the ``prior``, but no more than the position before it: the optimistic
    prior stays only while nothing says otherwise (rejections at draft 1 alone would leave drafts 2..K at the prior,
    and ``E(K)`` twice what the evidence supports), and it follows that position back up as it recovers. Capped once
    and left there, one rejection at draft 3 in the first verification of 4-token matches had held draft 4 at 0.45
    for 15 verifications of greedy ``repeat`` (every sequence drafted 3) while draft 3 climbed back to 0.9."""
    for j in range(1, len(acceptance)):
        if observations[j] == 0:
            acceptance[j] = min(prior, acceptance[j - 1])


def shrunk_acceptance(own: list[float], observations: list[int], engine: list[float]) -> list[float]:
    """Per position, the sequence's own mean acceptance ``own`` over ``observations`` verifications (an exponential
    mean past ``1 / MIN_WEIGHT`` of them, so it counts as that many) pulled towards the engine-wide estimate
    ``engine``, worth ``SEQ_PRIOR_WEIGHT`` observations; positions the sequence never drafted take the engine's
    estimate as it is (``cap_unobserved`` keeps that no better than the position before where the engine has
    not observed it either)."""
    n_max, w = 1.0 / MIN_WEIGHT, SEQ_PRIOR_WEIGHT
    return [g if not n else (w * g + min(n, n_max) * m) / (w + min(n, n_max))
            for m, n, g in zip(own, observations, engine)]


def best_num_drafts(acceptance: list[float], step_share: float, extra_seconds: list[float]) -> int:
    """The ``k`` in ``[0, len(extra_seconds)]`` maximising ``(1 + E(k)) / (step_share + extra_seconds[k - 1])``.

    ``k > 0`` only when its rate beats plain decoding (``1 / step_share``) by ``MARGIN``; ties: smaller ``k``.
    """
    step_share = max(step_share, 1e-12)
    best_k, best_rate = 0, 0.0
    tokens, run = 1.0, 1.0                       # 1 + E(k), and the product of a_1..a_k, grown one k at a time
    for k, (a, x) in enumerate(zip(acceptance, extra_seconds), 1):
        run *= a
        tokens += run
        rate = tokens / (step_share + x)
        if rate > best_rate * (1 + 1e-6):
            best_k, best_rate = k, rate
    return best_k if best_rate * step_share > 1.0 + MARGIN else 0


def step_speedup(num_seqs: int, plain_seconds: float, accepted_drafts: float, extra_seconds: float) -> float:
    """Expected tokens per second of a step over ``num_seqs`` sequences whose speculating ones expect
    ``accepted_drafts`` accepted drafts in all (the sum of their ``E(k)``) at ``extra_seconds`` in all (the sum of
    their ``x(B, k)``), over a plain step's: ``(B + sum E) / B * t / (t + sum x)``."""
    return (num_seqs + accepted_drafts) / num_seqs * plain_seconds / max(plain_seconds + extra_seconds, 1e-12)


def probe_interval_for_budget(num_seqs: int, plain_seconds: float, probe_seconds: float) -> int:
    """Steps between one sequence's probes so that the probes of ``num_seqs`` sequences cost at most
    ``PROBE_BUDGET`` of the plain step time: ``num_seqs * loss / (PROBE_BUDGET * t(B))``, where ``loss`` is
    what one probe costs: ``x(B, k)``, less what it is expected to yield (``E(k) * t(B) / B``). At large
    batches drafts cost a verifying sequence about a whole share of the step (its own multi-token
    attention, its rejection), so probing every few steps would be most of the loss."""
    return math.ceil(num_seqs * probe_seconds / (PROBE_BUDGET * max(plain_seconds, 1e-12)))


@dataclass
class _SeqState:
    acceptance: list[float]          # per position, the sequence's own mean (shrunk_acceptance)
    observations: list[int]          # ... and the verifications behind it
    last_seen: int = 0
    steps_at_zero: int = 0           # rounds at k = 0 since the last speculative one
    probe_at: int = 0                # ... at which the next probe goes (0: not at k = 0)
    probe_interval: int = PROBE_EVERY
    steps_short: int = 0             # rounds drafting fewer than the cap since the positions past k were observed
    reuse: tuple | None = None       # (k_max, batch size, sampled) of a standing choice of the full k (REUSE_ROUNDS)
    reuse_until: int = 0             # ... and the round up to which it stands
    reuse_gain: tuple = (0.0, 0.0)   # ... and what it expects: (E(k), x(B, k))


@dataclass
class AdaptiveDraftLength:
    """Per-sequence draft length from measured acceptance and costs; ``enabled=False``: always the maximum.

    The engine's calls per step: ``observe_verify`` for each sequence that verified drafts and then, for
    a decode-only step, ``observe_step``; then ``plain_step_due``, ``choose`` for each decoding sequence
    and ``observe_draft`` with the proposer's time for the drafts of the next step.
    """

    max_k: int
    enabled: bool = True
    costs: StepCosts = field(default_factory=StepCosts)            # steps of greedy requests only
    sampled_costs: StepCosts = field(default_factory=StepCosts)    # steps with a sampled request (module docstring)
    global_acceptance: dict[int, list[float]] = field(default_factory=dict)   # evidence -> engine-wide, per position
    global_observations: dict[int, list[int]] = field(default_factory=dict)   # behind each of them
    _seqs: dict[tuple[int, int], _SeqState] = field(default_factory=dict)    # (seq_id, evidence) -> state
    _round: int = 0                   # proposal rounds so far
    _pending_draft_seconds: float = 0.0   # the proposer's time for the drafts the next step verifies
    _step_speculating: int = 0        # sequences that verified drafts in the step being observed
    _step_max_drafts: int = 0         # the longest draft run among them
    _round_estimates: dict = field(default_factory=dict)   # (num_decoding, k_max) -> costs, for this round
    _remeasure: bool = False          # this round: the bucket's draft costs are stale, everyone drafts fully
    _quiet_rounds: int = 0            # rounds in a row in which no sequence drafted on merit (awake rounds)
    _merit: bool = False              # this round, some ``choose`` picked k > 0 because drafts pay
    _drafted: bool = False            # this round, some ``choose`` picked k > 0 (merit, probe or re-measurement)
    _verify_next: bool = False        # the last awake round drafted: the next round observes the verification
    _dozed: int = 0                   # rounds skipped since the last awake one, while dozing
    _sampled: bool = False            # this round's decoding sequences include a sampled one
    _gain: list = field(default_factory=lambda: [0.0, 0.0])   # this round's merit choices: sum of E(k), of x(B, k)
    _gain_basis: tuple | None = None  # (sampled, batch size, plain seconds) of those choices; None: none this round
    _speedup: dict = field(default_factory=dict)   # (sampled, bucket) -> step_speedup of its last round with merit

    def _global(self, evidence: int) -> tuple[list[float], list[int]]:
        """The engine-wide per-position acceptance of one evidence class and the observations behind it."""
        if evidence not in self.global_acceptance:
            self.global_acceptance[evidence] = [PRIOR_ACCEPTANCE] * self.max_k
            self.global_observations[evidence] = [0] * self.max_k
        return self.global_acceptance[evidence], self.global_observations[evidence]

    def _state(self, seq_id: int, evidence: int = 0) -> _SeqState:
        st = self._seqs.get((seq_id, evidence))
        if st is None:
            st = self._seqs[(seq_id, evidence)] = _SeqState([0.0] * self.max_k, [0] * self.max_k)
        st.last_seen = self._round
        return st

    def acceptance(self, seq_id: int, evidence: int = 0) -> list[float]:
        """The sequence's per-position acceptance estimate for drafts backed by ``evidence`` (shrunk_acceptance)."""
        return self._shrunk(self._state(seq_id, evidence), evidence)

    def _shrunk(self, st: _SeqState, evidence: int) -> list[float]:
        return shrunk_acceptance(st.acceptance, st.observations, self._global(evidence)[0])

    def idle(self, seq_id: int, evidence: int = 0) -> bool:
        """Whether the sequence sits at ``k = 0`` with no probe due this round (the step is counted; the caller
        proposes nothing and need not ``choose``). Nothing was verified since ``k = 0`` was chosen, so the
        acceptance that chose it has not moved; deciding again every step would cost more than the decision
        is worth (a plain decode step of the fast path is ~0.5 ms)."""
        st = self._seqs.get((seq_id, evidence))
        if st is None or self._remeasure or not 0 < st.steps_at_zero < st.probe_at - 1:
            return False
        st.steps_at_zero += 1
        st.last_seen = self._round
        return True

    def choose(self, seq_id: int, k_max: int, num_decoding: int, evidence: int = 0) -> int:
        """Drafts to propose for one sequence this step (``k_max``: its own cap), for drafts backed by
        ``evidence``."""
        k = self._choose(seq_id, k_max, num_decoding, evidence)
        if k > 0:
            self._drafted = True
        return k

    def _choose(self, seq_id: int, k_max: int, num_decoding: int, evidence: int) -> int:
        k_max = min(k_max, self.max_k)
        if k_max <= 0:
            return 0
        if not self.enabled:
            return k_max
        if self.idle(seq_id, evidence):
            return 0
        st = self._state(seq_id, evidence)
        if self._remeasure:                   # stale costs: everyone drafts fully once; this sequence's probe too
            st.steps_at_zero = st.probe_at = 0
            return k_max
        n = max(1, num_decoding)
        if st.reuse is not None and self._round <= st.reuse_until and st.reuse == (k_max, n, self._sampled):
            self._merit = True                           # the full k stands (module docstring)
            self._add_gain(*st.reuse_gain)
            return k_max
        plain, extras, _, probe_seconds = self._estimates(n, k_max)
        if plain is None or extras[0] is None:           # costs unknown: speculate fully to measure them
            self._merit = True                           # (nothing is known yet: no dozing until it is)
            return k_max
        acceptance = self._shrunk(st, evidence)
        k = best_num_drafts(acceptance, plain / n, extras)
        if k > 0:
            st.steps_at_zero, st.probe_at, st.probe_interval = 0, 0, PROBE_EVERY
            self._merit = True
            gain = (expected_accepted(acceptance, k), extras[k - 1])
            self._gain_basis = (self._sampled, n, plain)
            self._add_gain(*gain)
            if k >= k_max:                               # stands while every draft is accepted
                st.reuse, st.reuse_until = (k_max, n, self._sampled), self._round + REUSE_ROUNDS - 1
                st.reuse_gain = gain
            return self._deepen(st, acceptance, k, k_max, n, plain, extras)
        st.steps_at_zero += 1
        # a probe's expected loss: its cost less the tokens it is expected to yield (a sequence just below
        # break-even, e.g. after one early rejection, is probed again soon; one whose drafts fail, rarely)
        loss = max(0.0, probe_seconds - expected_accepted(acceptance, k_max) * plain / n)
        st.probe_at = max(st.probe_interval, probe_interval_for_budget(n, plain, loss))
        if st.steps_at_zero >= st.probe_at:              # probe: learns every position at once
            st.steps_at_zero = st.probe_at = 0
            st.probe_interval = min(PROBE_MAX, 2 * st.probe_interval)
            return k_max
        return 0

    def _add_gain(self, accepted_drafts: float, extra_seconds: float) -> None:
        self._gain[0] += accepted_drafts
        self._gain[1] += extra_seconds

    def _deepen(self, st: _SeqState, acceptance: list[float], k: int, k_max: int, n: int, plain: float,
                extras: list[float]) -> int:
        """``k``, or now and then the cap: positions past ``k`` are observed only when drafted, so one early
        rejection there would otherwise hold ``k`` below the cap for the rest of the request. The interval is
        that of a probe whose loss is the extra drafts' cost less what they are expected to yield."""
        if k >= k_max:
            st.steps_short = 0
            return k
        st.steps_short += 1
        gain = (expected_accepted(acceptance, k_max) - expected_accepted(acceptance, k)) * plain / n
        loss = max(0.0, extras[k_max - 1] - extras[k - 1] - gain)
        if st.steps_short < max(PROBE_EVERY, probe_interval_for_budget(n, plain, loss)):
            return k
        st.steps_short = 0
        return k_max

    def _estimates(self, n: int, k_max: int) -> tuple[float | None, list[float | None], int, float]:
        """(plain step seconds, ``x(n, 1..k_max)``, interval between probes costing ``x(n, k_max)`` each within
        the budget, ``x(n, k_max)`` (not optimistic)), computed once per round."""
        key = (n, k_max)
        if key not in self._round_estimates:
            costs = self.round_costs
            plain = costs.plain_seconds(n)
            extras, pessimistic = costs.extra_seconds_upto(n, k_max)
            if extras is None:
                extras = [None] * k_max
            probe_every, probe_seconds = 0, 0.0
            if plain is not None and extras[0] is not None:
                probe_seconds = pessimistic
                probe_every = probe_interval_for_budget(n, plain, probe_seconds)
            self._round_estimates[key] = (plain, extras, probe_every, probe_seconds)
        return self._round_estimates[key]

    def observe_verify(self, seq_id: int, num_drafts: int, num_accepted: int, evidence: int = 0) -> None:
        """Draft ``j <= num_accepted`` was accepted; draft ``num_accepted + 1`` (if any) was rejected; the
        drafts were backed by ``evidence``."""
        st = self._state(seq_id, evidence)
        if num_accepted < num_drafts:                    # a rejection: the next choice is made afresh
            st.reuse = None
        acceptance, observations = self._global(evidence)
        for j in range(min(num_drafts, num_accepted + 1, self.max_k)):
            hit = 1.0 if j < num_accepted else 0.0
            weight = max(MIN_WEIGHT, 1.0 / (st.observations[j] + 1))
            st.acceptance[j] += weight * (hit - st.acceptance[j])
            st.observations[j] += 1
            g = max(GLOBAL_DECAY, 1.0 / (PRIOR_WEIGHT + observations[j] + 1))
            acceptance[j] += g * (hit - acceptance[j])
            observations[j] += 1
        cap_unobserved(acceptance, observations)
        if num_drafts > 0:
            self._step_speculating += 1
            self._step_max_drafts = max(self._step_max_drafts, num_drafts)

    def costs_for(self, sampled: bool) -> StepCosts:
        """The step costs of steps with a sampled request (``sampled``), or of steps of greedy requests only."""
        return self.sampled_costs if sampled else self.costs

    @property
    def round_costs(self) -> StepCosts:
        """The step costs this round's choices read (its decoding sequences include a sampled one, or not)."""
        return self.costs_for(self._sampled)

    def observe_step(self, num_seqs: int, num_drafts: int, seconds: float, sampled: bool = False) -> None:
        """A decode-only step (no prefill chunk) over ``num_seqs`` sequences verifying ``num_drafts`` took ``seconds``;
        ``sampled``: some of its sequences sample (their verification costs more than a greedy argmax)."""
        costs = self.costs_for(sampled)
        if num_drafts == 0:
            costs.observe_plain(num_seqs, seconds)
        else:
            costs.observe_speculative(num_seqs, self._step_speculating, self._step_max_drafts,
                                      seconds + self._pending_draft_seconds)
        self._end_step()

    def plain_step_due(self, num_decoding: int, sampled: bool = False) -> bool:
        """Whether the next step should run without drafts, to measure a plain step at this batch size
        (``sampled``: among the decoding sequences is a sampled one; the round's choices read those costs).

        Called once per proposal round: what was gathered about the last step is complete by now."""
        self._end_step()
        if self._gain_basis is not None:                 # what the last round's merit choices expected to gain
            was_sampled, n_seen, plain_seen = self._gain_basis
            self._speedup[(was_sampled, bucket(n_seen))] = step_speedup(n_seen, plain_seen, *self._gain)
        self._gain, self._gain_basis = [0.0, 0.0], None
        self._sampled = sampled
        self._round += 1
        if self._round % FORGET_AFTER == 0:               # sequences chosen for but never freed (k stayed 0)
            self._seqs = {s: st for s, st in self._seqs.items() if self._round - st.last_seen < FORGET_AFTER}
        if not self.enabled:
            return False
        n, costs = max(1, num_decoding), self.round_costs
        # stale draft costs are re-measured, no more often than the probe budget allows at this batch size
        self._remeasure = costs.remeasure_due(n) and \
            costs.since_speculative[bucket(n)] >= self._estimates(n, self.max_k)[2]   # probes costing x
        # plain steps measured sooner where speculating gains little (step_costs.plain_interval)
        return costs.plain_step_due(n, plain_interval(self._speedup.get((sampled, bucket(n)))))

    def asleep(self) -> bool:
        """Called once per proposal round before anything else: whether the speculator should skip this round
        (propose nothing, decide nothing): dozing, and not the round in ``DOZE_EVERY`` that is awake, nor the
        round after one that drafted (its step verifies the drafts, and this round observes them)."""
        if self._quiet_rounds < DOZE_AFTER or self._dozed >= DOZE_EVERY - 1 or self._verify_next:
            self._dozed = 0
            self._verify_next = False
            return False
        self._dozed += 1
        self._round += 1
        return True

    def wake(self) -> None:
        """End any doze: speculation resumes after the governor's epochs without it (governor.py), where nothing
        was observed, so the next rounds decide afresh."""
        self._quiet_rounds = self._dozed = 0

    def end_round(self) -> None:
        """An awake round's choices are made: it was quiet unless some sequence drafts on merit (module docstring)."""
        if not self.enabled:
            return
        self._quiet_rounds = 0 if self._merit else self._quiet_rounds + 1
        self._verify_next = self._drafted       # a probe's verification is observed, whatever the doze says
        self._merit = self._drafted = False

    def observe_draft(self, seconds: float, num_draft_tokens: int) -> None:
        """The proposer took ``seconds`` for the drafts (``num_draft_tokens`` in all) the next step verifies."""
        self._pending_draft_seconds = seconds if num_draft_tokens > 0 else 0.0

    def _end_step(self) -> None:
        self._round_estimates = {}
        self._pending_draft_seconds = 0.0
        self._step_speculating = self._step_max_drafts = 0

    def free(self, seq_ids: list[int]) -> None:
        gone = set(seq_ids)
        for key in [key for key in self._seqs if key[0] in gone]:
            del self._seqs[key]
