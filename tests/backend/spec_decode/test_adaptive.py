"""Adaptive draft length: k from measured acceptance and step costs (synthetic timings, no engine)."""
from __future__ import annotations

import itertools
import random

import pytest

from backend.spec_decode.adaptive import (
    DOZE_AFTER,
    DOZE_EVERY,
    FORGET_AFTER,
    GLOBAL_DECAY,
    MARGIN,
    MIN_WEIGHT,
    PRIOR_ACCEPTANCE,
    PROBE_EVERY,
    PROBE_MAX,
    REUSE_ROUNDS,
    SEQ_PRIOR_WEIGHT,
    AdaptiveDraftLength,
    best_num_drafts,
    cap_unobserved,
    expected_accepted,
    probe_interval_for_budget,
    shrunk_acceptance,
    step_speedup,
)
from backend.spec_decode.step_costs import (
    PLAIN_BUDGET,
    PLAIN_EVERY,
    PLAIN_EVERY_MIN,
    PLAIN_EVERY_UNSETTLED,
    SETTLED,
    STALE_AFTER,
    STALE_LENGTH,
    RecentTimes,
    StepCosts,
    bucket,
    interpolate_extra,
    plain_interval,
)


def test_expected_accepted_is_the_sum_of_running_products():
    assert expected_accepted([0.5, 0.5, 0.5], 3) == 0.5 + 0.25 + 0.125
    assert expected_accepted([1.0, 0.0, 1.0], 3) == 1.0


def test_best_k_trades_acceptance_against_cost():
    linear = [0.05 * k for k in range(1, 5)]
    assert best_num_drafts([0.9] * 4, 1.0, linear) == 4                  # cheap and accepted: all
    assert best_num_drafts([0.05] * 4, 1.0, [0.2 * k for k in range(1, 5)]) == 0   # rarely accepted: none
    # compute-bound: a draft token costs as much as a whole sequence's share of the step
    assert best_num_drafts([0.6] * 4, 1.0, [1.0 * k for k in range(1, 5)]) == 0
    # a fixed cost per speculating sequence favours longer runs once it is paid
    assert best_num_drafts([0.8] * 4, 1.0, [0.5 + 0.02 * k for k in range(1, 5)]) == 4
    # drafts must beat plain decoding by MARGIN: a draft of 10% acceptance that costs 5% of the step pays (1.048x),
    # one that costs 12% does not (0.98x)
    assert best_num_drafts([0.10], 1.0, [0.05]) == (1 if 1.1 / 1.05 > 1 + MARGIN else 0)
    assert best_num_drafts([0.10], 1.0, [0.12]) == 0
    assert best_num_drafts([0.0], 1.0, [0.0]) == 0                      # a tie: plain decoding


def test_a_sequences_acceptance_is_its_own_mean_shrunk_towards_the_engines():
    engine = [0.9, 0.8, 0.7, 0.6]
    assert shrunk_acceptance([0.0] * 4, [0] * 4, engine) == engine             # nothing of its own yet
    w = SEQ_PRIOR_WEIGHT
    got = shrunk_acceptance([0.0, 1.0, 0.5, 0.0], [1, 3, 2, 0], engine)
    assert got == pytest.approx([w * 0.9 / (w + 1), (w * 0.8 + 3) / (w + 3), (w * 0.7 + 1) / (w + 2), 0.6])
    # an exponential mean counts as 1 / MIN_WEIGHT observations however many are behind it
    many = round(1 / MIN_WEIGHT)
    assert shrunk_acceptance([0.2], [10 * many], [0.9]) == pytest.approx(shrunk_acceptance([0.2], [many], [0.9]))


def test_one_rejection_in_a_copying_request_keeps_its_full_k():
    """Drafts of a copy are accepted ~always: a new sequence's first rejection, at draft 3, must not cut its k.
    It did while one rejection halved the position's estimate (a prior worth one observation), and then only a
    probe now and then could undo it."""
    pol = AdaptiveDraftLength(4)
    # a draft token costs 0.4 of a plain step: drafts 3 and 4 pay only when accepted more than ~70% of the time
    sim = Sim(pol, plain=lambda n: 0.002, fixed=0.0002, per_token=0.0008)
    for s in range(60):                                         # other requests copy: every draft accepted
        sim.step([100 + s // 20], lambda s, k: k)
    first = 0
    while not first:                                            # (past a plain step the policy may run first)
        first = sim.step([1], lambda s, k: min(k, 2))[0]
    assert first == 4                                           # ... and draft 3 was rejected
    ks = [k for k in (sim.step([1], lambda s, k: k)[0] for _ in range(6)) if k]
    assert len(ks) >= 5 and set(ks) == {4}
    # drafts that keep failing at draft 3 do cut it: the sequence's own evidence outweighs the engine's
    ks = [k for k in (sim.step([1], lambda s, k: min(k, 2))[0] for _ in range(20)) if k]
    assert ks[-1] == 2


def test_interpolation_errs_low_between_and_grows_in_proportion_above():
    measured = {4: 0.8}                                          # fixed 0.4 + 0.1 per draft, measured at k = 4
    assert interpolate_extra(measured, 2) == pytest.approx(0.4)     # true 0.6: tried, then known
    measured[2] = 0.6
    assert interpolate_extra(measured, 3) == pytest.approx(0.7)
    assert interpolate_extra({1: 0.3}, 3) == pytest.approx(0.9)


def test_step_costs_per_bucket_and_per_length():
    costs = StepCosts()
    assert costs.plain_seconds(1) is None and costs.plain_step_due(1) and costs.extra_seconds(1, 1) is None
    costs.observe_plain(1, 0.002)
    for i in range(SETTLED):                                     # 4 drafts cost 2 ms more than a plain step
        assert costs.extra_seconds(1, 4) is None                 # not before SETTLED steps with drafts
        costs.observe_speculative(1, 1, 4, 0.004)
    assert costs.plain_seconds(1) == 0.002 and costs.extra_seconds(1, 4) == pytest.approx(0.002)
    costs.observe_plain(8, 0.004)
    costs.observe_speculative(8, 8, 2, 0.020)                    # 8 sequences x 2 drafts: 2 ms each
    assert costs.extra_seconds(8, 2) == pytest.approx(0.002 * 2 / 4)   # one step: bucket 1 stands in
    for _ in range(SETTLED - 1):
        costs.observe_speculative(8, 8, 2, 0.020)
    assert costs.extra_seconds(5, 2) == pytest.approx(0.002) and costs.extra_seconds(8, 4) == pytest.approx(0.004)
    assert costs.extra_seconds(2, 4) == pytest.approx(0.002)     # bucket 2 unmeasured: the nearest (1) lends
    assert costs.snapshot() == ({1: 0.002, 8: 0.004}, {1: {4: pytest.approx(0.002)}, 8: {2: pytest.approx(0.002)}})


def test_a_one_off_slow_first_step_with_drafts_does_not_stop_speculation():
    """The first step with drafts takes 10 ms more (a one-off: a first verify, another process) in a workload
    whose drafts are all accepted. A bucket's costs count after SETTLED such steps (their median), so the policy
    keeps drafting; on one step it had gone to k = 0 for ~1,100 steps, until a re-measurement."""
    pol = AdaptiveDraftLength(4)
    ks, first = [], True
    for _ in range(200):
        k = 0 if pol.plain_step_due(1) else pol.choose(1, 4, 1, 8)
        if k:
            pol.observe_draft(2e-5, k)
            pol.observe_verify(1, k, k, 8)
        pol.observe_step(1, k, 0.0004 + (0.00007 * k + (0.010 if first else 0.0) if k else 0.0))
        first = first and not k
        ks.append(k)
    assert ks[0] == 0 and ks[1:SETTLED + 1] == [4] * SETTLED
    assert sum(1 for k in ks if k == 4) > 0.9 * len(ks)      # plain steps only now and then, to keep t current


def test_plain_step_is_remeasured_sooner_while_unsettled():
    costs = StepCosts()
    costs.observe_plain(1, 0.002)
    ks = []
    for _ in range(3 * PLAIN_EVERY):
        ks.append(costs.plain_step_due(1))
        if ks[-1]:
            costs.observe_plain(1, 0.002)
        else:
            costs.observe_speculative(1, 1, 4, 0.004)
    due = [i for i, d in enumerate(ks) if d]
    assert due[:2] == [PLAIN_EVERY_UNSETTLED, 2 * PLAIN_EVERY_UNSETTLED + 1]
    assert due[2] - due[1] == PLAIN_EVERY + 1                    # settled after SETTLED plain steps


def test_slow_steps_from_other_processes_do_not_move_the_estimates():
    costs = StepCosts()
    for t in (0.009, 0.002, 0.002, 0.002, 0.030, 0.002, 0.002):  # two descheduled steps among seven
        costs.observe_plain(1, t)
    assert costs.plain_seconds(1) == 0.002
    for _ in range(SETTLED):
        costs.observe_speculative(1, 1, 3, 0.003)
    costs.observe_speculative(1, 1, 4, 0.050)                    # a first measurement at k = 4, descheduled
    assert costs.extra_seconds(1, 4) == pytest.approx(0.001 * 4 / 3)   # unsettled: no more than k = 3 implies
    for _ in range(SETTLED):
        costs.observe_speculative(1, 1, 4, 0.0035)
    assert costs.extra_seconds(1, 4) == pytest.approx(0.0015)


def test_a_stale_length_is_no_dearer_than_the_fresh_lengths_imply():
    """A burst of slow steps leaves k = 4's median high; while k = 1 keeps speculation going, k = 4 is never
    measured again. Once the bucket has had STALE_LENGTH steps with drafts since, k = 4 counts at what the
    fresh lengths imply, so the policy tries it again (and a new measurement decides)."""
    costs = StepCosts()
    for _ in range(SETTLED):
        costs.observe_plain(1, 0.002)
    for _ in range(SETTLED):
        costs.observe_speculative(1, 1, 4, 0.002 + 0.010)      # slowed down: x(4) = 10 ms
    for i in range(STALE_LENGTH):
        costs.observe_speculative(1, 1, 1, 0.002 + 0.0005)
        stale = i + 1 >= STALE_LENGTH
        assert costs.extra_seconds(1, 4) == pytest.approx(0.002 if stale else 0.010)   # 4 x x(1) once stale
        assert costs.extra_seconds(1, 4, optimistic=False) == pytest.approx(0.010)      # probes still budget it
    costs.observe_speculative(1, 1, 4, 0.002 + 0.0015)          # measured again: replaces the slow burst
    assert costs.extra_seconds(1, 4) == pytest.approx(0.0015)
    for _ in range(SETTLED):
        costs.observe_speculative(1, 1, 4, 0.002 + 0.003)
    assert costs.extra_seconds(1, 4) == pytest.approx(0.003)    # fresh and settled: its own median


class Sim:
    """Drives the policy as the engine does, with a synthetic cost model and acceptance.

    step seconds = plain(B) + per speculating sequence (fixed + per_token * k); the proposer's time,
    measured apart as in the engine, is draft_step * max k.
    """

    def __init__(self, pol: AdaptiveDraftLength, plain, fixed, per_token, draft_step=0.0, sleeps=False):
        self.pol, self.plain, self.fixed, self.per_token, self.draft_step = pol, plain, fixed, per_token, draft_step
        self.sleeps = sleeps       # drive ``asleep`` / ``end_round`` as the speculator does
        self.slept = 0             # rounds skipped asleep

    def step(self, seqs: list[int], accept, evidence=lambda s: 0) -> list[int]:
        """One proposal round and the step that verifies it; ``accept(seq, k)`` -> accepted drafts;
        ``evidence(seq)``: what backs the sequence's proposal this round."""
        pol, n = self.pol, len(seqs)
        if self.sleeps and pol.asleep():
            self.slept += 1
            return [0] * n
        ev = {s: evidence(s) for s in seqs}
        ks = [0] * n if pol.plain_step_due(n) else [pol.choose(s, 4, n, ev[s]) for s in seqs]
        if self.sleeps:
            pol.end_round()
        if any(ks):
            pol.observe_draft(self.draft_step * max(ks), sum(ks))
        seconds = self.plain(n) + sum(self.fixed + self.per_token * k for k in ks if k)
        for s, k in zip(seqs, ks):
            if k:
                pol.observe_verify(s, k, accept(s, k), ev[s])
        pol.observe_step(n, sum(ks), seconds)
        return ks


def test_k_drops_to_zero_within_a_few_steps_when_drafts_fail():
    pol = AdaptiveDraftLength(4)
    sim = Sim(pol, plain=lambda n: 0.002, fixed=0.0005, per_token=0.0002, draft_step=0.0013)   # a draft model
    history = [sim.step([1], lambda s, k: 0)[0] for _ in range(40)]
    assert history[:2] == [0, 4]                  # a plain step, then the full k to measure costs
    assert set(history[4:]) == {0}                # off after a couple of rejected runs; a probe (four drafts:
    assert probe_interval_for_budget(1, 0.002, 0.0065) == 163    # 6.5 ms) may come only every 163 steps


def test_reprobes_with_backoff_and_within_the_budget_at_large_batches():
    pol = AdaptiveDraftLength(4)
    sim = Sim(pol, plain=lambda n: 0.002, fixed=0.0002, per_token=0.0001)    # n-gram at batch 1
    for _ in range(10):
        sim.step([1], lambda s, k: 0)
    assert pol.choose(1, 4, 1) == 0
    ks = [sim.step([1], lambda s, k: 0)[0] for _ in range(8 * PROBE_MAX)]
    probes = [i for i, k in enumerate(ks) if k]
    assert all(ks[i] == 4 for i in probes)        # a probe measures every position
    gaps = [b - a for a, b in itertools.pairwise(probes)]
    assert gaps[0] >= 2 * PROBE_EVERY and gaps[1] >= 4 * PROBE_EVERY     # the interval doubles while probes fail
    assert min(gaps[-2:]) >= PROBE_MAX and pol._seqs[(1, 0)].probe_interval == PROBE_MAX
    # 32 sequences, where drafts cost a verifying sequence 1.5 ms against a 13.5 ms step: probes of all
    # of them within 2% of the step time means one probe per sequence in 178 steps if a probe yielded nothing;
    # after one rejection the first position's acceptance is 0.45 (the others unobserved, 0.9): a probe is
    # expected to yield E(4) tokens, so its expected loss, and the interval, are smaller, and grow as probes fail
    assert probe_interval_for_budget(32, 0.0135, 0.0015) == 178
    first_loss = 0.0015 - expected_accepted([0.45, 0.9, 0.9, 0.9], 4) * 0.0135 / 32
    shortest = probe_interval_for_budget(32, 0.0135, first_loss)
    assert 90 < shortest < 178
    big = Sim(AdaptiveDraftLength(4), plain=lambda n: 0.0135, fixed=0.0015, per_token=0.0)
    seqs = list(range(32))
    steps = [big.step(seqs, lambda s, k: 0) for _ in range(500)]
    measuring = 1 + SETTLED                        # a plain step, then SETTLED steps at k = 4, then off (a
    # re-measurement later is a single step at k = 4, budgeted as a probe)
    assert steps[1:measuring] == [[4] * 32] * SETTLED and not any(any(ks) for ks in steps[measuring:40])
    for i in range(32):
        probes = [t for t, ks in enumerate(steps) if t >= measuring and ks[i]]
        gaps = [b - a for a, b in itertools.pairwise(probes)]
        assert 1 <= len(probes) <= 4 and probes[0] >= shortest and all(g >= shortest for g in gaps)
        assert gaps == sorted(gaps)                # each failed probe lowers the acceptance: longer gaps


def test_k_rises_when_drafts_are_accepted():
    pol = AdaptiveDraftLength(4)
    sim = Sim(pol, plain=lambda n: 0.002, fixed=0.0002, per_token=0.0001)       # n-gram: no proposer cost
    for _ in range(10):
        sim.step([1], lambda s, k: 0)
    assert sim.step([1], lambda s, k: 0) == [0]
    ks = [sim.step([1], lambda s, k: k)[0] for _ in range(6 * PROBE_MAX)]       # the workload turns repetitive
    assert ks[-1] == 4 and ks.index(4) < 3 * PROBE_MAX


def test_batch_size_dependence_from_measured_costs():
    """The same acceptance pays at batch 1 and not at batch 16, where verify tokens cost as much as any."""
    pol = AdaptiveDraftLength(4)
    plain = {1: 0.002, 16: 0.006}
    sim = Sim(pol, plain=lambda n: plain[n], fixed=0.0, per_token=0.0003)      # per token: 1/20 step at batch 1
    calls = iter(range(10**6))

    def accept(seq: int, k: int) -> int:                      # the first draft 60% of the time, never the second
        return min(k, 1) if next(calls) % 5 < 3 else 0

    ks1 = [sim.step([1], accept)[0] for _ in range(30)]
    assert ks1[-1] > 0
    seqs = list(range(100, 116))
    last = [sim.step(seqs, accept) for _ in range(30)][-1]
    assert last == [0] * 16                   # at batch 16 a draft costs 0.8 of a sequence's share
    assert pol.choose(1, 4, 1) > 0            # batch 1 still pays: costs are kept per bucket


def test_disabled_policy_always_proposes_the_cap_and_new_sequences_start_from_the_engine_estimate():
    assert AdaptiveDraftLength(4, enabled=False).choose(1, 3, 1) == 3
    assert AdaptiveDraftLength(4, enabled=False).choose(1, 9, 1) == 4
    pol = AdaptiveDraftLength(4)
    sim = Sim(pol, plain=lambda n: 0.002, fixed=0.0002, per_token=0.0001)
    for seq in range(40):
        for _ in range(6):
            sim.step([seq], lambda s, k: 0)
        pol.free([seq])
    assert pol.global_acceptance[0][0] < 0.2       # (later positions are never reached)
    assert pol.choose(99, 4, 1) == 0          # a new sequence does not relearn what the engine knows


def test_states_of_sequences_never_freed_are_dropped():
    pol = AdaptiveDraftLength(4)
    pol.observe_step(1, 0, 0.002)
    pol.choose(7, 4, 1)
    for _ in range(2 * FORGET_AFTER):
        pol.plain_step_due(1)
    assert (7, 0) not in pol._seqs


def test_bucket_is_the_next_power_of_two():
    assert [bucket(n) for n in (1, 2, 3, 5, 8, 9, 32)] == [1, 2, 4, 8, 8, 16, 32]


def test_a_sequence_at_zero_is_not_re_decided_between_probes(monkeypatch):
    """k = 0 costs a counter per step: the estimates and the rate maths run only when a probe may be due."""
    pol = AdaptiveDraftLength(4)
    sim = Sim(pol, plain=lambda n: 0.002, fixed=0.0005, per_token=0.0002)
    for _ in range(10):
        sim.step([1], lambda s, k: 0)
    st = pol._seqs[(1, 0)]
    assert st.steps_at_zero > 0 and st.probe_at > st.steps_at_zero
    assert not pol.idle(99)                                 # unknown sequences are decided, never skipped
    at = st.steps_at_zero
    assert pol.idle(1) and st.steps_at_zero == at + 1      # the speculator's shortcut counts the step
    from backend.spec_decode import adaptive
    decisions = []
    real = adaptive.best_num_drafts
    monkeypatch.setattr(adaptive, "best_num_drafts", lambda *a: decisions.append(1) or real(*a))
    ks = []
    while not ks or ks[-1] == 0:
        ks.append(sim.step([1], lambda s, k: 0)[0])
    assert ks[-1] == 4 and len(ks) >= PROBE_EVERY // 2      # the probe comes on schedule, with the full k
    assert len(decisions) == 1                              # decided once: on the round the probe was due


def test_a_choice_of_the_full_k_stands_while_every_draft_is_accepted(monkeypatch):
    """The full decision runs once per REUSE_ROUNDS rounds while a sequence's drafts are all accepted, and afresh
    after a rejection or a change of batch size; a choice below the cap is decided every round."""
    from backend.spec_decode import adaptive
    pol = AdaptiveDraftLength(4)
    sim = Sim(pol, plain=lambda n: 0.002, fixed=0.0002, per_token=0.0001)
    for _ in range(20):
        sim.step([1], lambda s, k: k)
    decisions = []
    real = adaptive.best_num_drafts
    monkeypatch.setattr(adaptive, "best_num_drafts", lambda *a: decisions.append(1) or real(*a))
    ks = [sim.step([1], lambda s, k: k)[0] for _ in range(4 * REUSE_ROUNDS)]
    assert set(ks) <= {0, 4} and ks.count(4) >= 4 * REUSE_ROUNDS - 2     # (a plain step may measure t)
    assert 3 <= len(decisions) <= 5                                      # not one per round
    decisions.clear()
    sim.step([1], lambda s, k: k - 1)                                    # the last draft rejected
    sim.step([1], lambda s, k: k)
    assert decisions                                                     # decided afresh
    decisions.clear()
    sim.step([1], lambda s, k: k)
    for _ in range(3):                                                   # a second sequence joins: after
        sim.step([1, 2], lambda s, k: k)                                 # a plain step at batch 2, both
    assert len(decisions) >= 2                                           # are decided, the first afresh
    pol2 = AdaptiveDraftLength(4)
    sim2 = Sim(pol2, plain=lambda n: 0.002, fixed=0.0002, per_token=0.0001)
    for _ in range(20):
        sim2.step([1], lambda s, k: min(k, 2))                           # drafts 3 and 4 always rejected
    decisions.clear()
    ks = [sim2.step([1], lambda s, k: min(k, 2))[0] for _ in range(REUSE_ROUNDS)]
    assert ks.count(2) >= REUSE_ROUNDS - 2 and len(decisions) >= REUSE_ROUNDS - 1


def test_plain_steps_are_spaced_by_what_speculating_gains():
    assert plain_interval(None) == PLAIN_EVERY and plain_interval(1.0) == PLAIN_EVERY
    assert plain_interval(1.02) == PLAIN_EVERY_MIN                  # nearly nothing to lose: as often as allowed
    assert plain_interval(1.1) == 12                                 # (1 - 1/1.1) / 0.008 = 11.4
    assert plain_interval(2.0) == 63 and plain_interval(4.0) == PLAIN_EVERY
    for g in (1.05, 1.1, 1.3, 1.6, 2.0):                             # the plain steps' loss within the budget
        assert (1 - 1 / g) / plain_interval(g) <= PLAIN_BUDGET + 1e-12
    # a step of 2 sequences, one expecting 3 accepted drafts at 1 ms extra, plain 2 ms: 5 tokens in 3 ms against 2 in 2
    assert step_speedup(2, 0.002, 3.0, 0.001) == pytest.approx((5 / 0.003) / (2 / 0.002))


def test_the_plain_step_is_measured_sooner_where_drafts_gain_little():
    """Where drafts double throughput a plain step costs half a step and comes every ~64 steps with drafts; where they
    buy ~8% it costs ~8% of one and comes every ~10: a plain estimate from a slower spell then matters most."""
    def plain_steps(fixed: float, per_token: float, accept) -> tuple[int, int]:
        pol = AdaptiveDraftLength(4)
        sim = Sim(pol, plain=lambda n: 0.002, fixed=fixed, per_token=per_token)
        ks = [sim.step([1], accept)[0] for _ in range(400)][100:]
        return ks.count(0), len(ks) - ks.count(0)

    plain, drafted = plain_steps(0.0002, 0.0001, lambda s, k: k)                 # every draft accepted: ~3.8x
    assert drafted > 250 and plain <= drafted / (PLAIN_EVERY - 8)
    plain, drafted = plain_steps(0.0015, 0.0002, lambda s, k: min(k, 1))         # k = 1 at ~1.08x
    assert drafted > 200 and drafted / 13 <= plain <= drafted / 8


def test_engine_wide_acceptance_is_an_average_at_first():
    """The optimistic prior goes after a few verifications; later ones move it by GLOBAL_DECAY."""
    pol = AdaptiveDraftLength(4)
    for seq in range(4):
        pol.observe_verify(seq, 4, 0)                       # the first draft rejected, four times
    assert pol.global_acceptance[0][0] == pytest.approx(PRIOR_ACCEPTANCE / 5)
    assert pol.global_acceptance[0][1] == pol.global_acceptance[0][0]    # never reached: no better than draft 1
    for seq in range(100):
        pol.observe_verify(seq, 4, 0)
    before = pol.global_acceptance[0][0]
    pol.observe_verify(999, 4, 1)                           # accepted once
    assert pol.global_acceptance[0][0] == pytest.approx(before + GLOBAL_DECAY * (1 - before))


def test_recent_times_estimate_follows_every_observation():
    times = RecentTimes()
    for t, want in ((0.003, 0.003), (0.001, 0.001), (0.002, 0.002), (0.009, 0.003), (0.0005, 0.002)):
        times.add(t)
        assert times.estimate() == want                     # min while unsettled, then the median


def test_stale_draft_costs_are_re_measured_and_replaced():
    """Costs measured while the machine was slow switch drafts off; after STALE_AFTER plain steps every
    sequence drafts once, the new measurement replaces the old one, and drafts that pay come back."""
    pol = AdaptiveDraftLength(4)
    slow = Sim(pol, plain=lambda n: 0.002, fixed=0.010, per_token=0.002)     # verify steps descheduled
    for _ in range(12):
        slow.step([1], lambda s, k: k)
    stale = pol.costs.extra_seconds(1, 4, optimistic=False)
    assert stale > 0.01
    due = max(STALE_AFTER, probe_interval_for_budget(1, 0.002, stale))  # within the probe budget
    fast = Sim(pol, plain=lambda n: 0.002, fixed=0.0002, per_token=0.0001)  # the machine is quiet again
    ks = [fast.step([2], lambda s, k: k)[0] for _ in range(due + 8)]
    first = next(i for i, k in enumerate(ks) if k)
    assert ks[first] == 4 and STALE_AFTER <= first <= due + 2           # re-measured, in one step
    assert pol.costs.extra_seconds(1, 4) < 0.001 and set(ks[first:]) - {0} == {4} and ks[-1] == 4
    # drafts that still do not pay: one step with drafts per STALE_AFTER plain ones
    pol2 = AdaptiveDraftLength(4)
    sim = Sim(pol2, plain=lambda n: 0.002, fixed=0.0005, per_token=0.0002)
    ks = [sim.step([s // 40], lambda s, k: 0)[0] for s in range(4 * STALE_AFTER)]   # short requests
    assert sum(1 for k in ks[8:] if k) <= 4 * (len(ks) // STALE_AFTER + 1)


@pytest.mark.parametrize("acceptance, interval", [
    ([0.0] * 4, 50),                  # drafts fail: a probe loses its whole cost, x = 2 ms of a 2 ms step
    ([0.4, 0.5, 0.5, 0.5], PROBE_EVERY),   # just below break-even: a probe is expected to yield 0.75 tokens
])
def test_probe_interval_budgets_a_probes_expected_loss(acceptance, interval):
    pol = AdaptiveDraftLength(4)
    for _ in range(SETTLED):
        pol.costs.observe_plain(1, 0.002)
        for k in range(1, 5):
            pol.costs.observe_speculative(1, 1, k, 0.004)       # x = 2 ms whatever k: a fixed cost per verify
    pol.global_acceptance[0], pol.global_observations[0] = list(acceptance), [100] * 4   # what the engine learnt
    assert pol.choose(1, 4, 1) == 0
    loss = 0.002 - expected_accepted(acceptance, 4) * 0.002
    assert pol._seqs[(1, 0)].probe_at == max(PROBE_EVERY, probe_interval_for_budget(1, 0.002, loss)) == interval


def test_acceptance_is_learnt_per_evidence_class():
    """Strong matches (evidence 4) are always accepted, weak ones (1) never: the same sequence drafts on the
    first and not on the second, and a new sequence starts from what the engine learnt for each."""
    pol = AdaptiveDraftLength(4)
    sim = Sim(pol, plain=lambda n: 0.002, fixed=0.0004, per_token=0.0002)
    for i in range(200):
        ev = 4 if i % 2 else 1                                  # a strong match, then a weak one
        sim.step([1], lambda s, k, ev=ev: k if ev == 4 else 0, evidence=lambda s, ev=ev: ev)
    assert pol.global_acceptance[4][0] > 0.9 and pol.global_acceptance[1][0] < 0.25   # few: it stops being tried
    assert pol.choose(1, 4, 1, evidence=4) == 4 and pol.choose(1, 4, 1, evidence=1) == 0
    assert pol.choose(2, 4, 1, evidence=4) == 4 and pol.choose(2, 4, 1, evidence=1) == 0
    pol.free([1, 2])
    assert not pol._seqs


def test_the_policy_dozes_while_nothing_drafts_and_wakes_on_the_first_draft():
    pol = AdaptiveDraftLength(4)
    sim = Sim(pol, plain=lambda n: 0.002, fixed=0.0005, per_token=0.0002, sleeps=True)
    seqs = [1, 2, 3]
    steps = [sim.step(seqs, lambda s, k: 0) for _ in range(2000)]
    drafting = [i for i, ks in enumerate(steps) if any(ks)]
    assert len(drafting) < 40                       # the probes of sequences at k = 0 still come, further apart
    # dozing: the speculator does nothing in 3 rounds of 4, once DOZE_AFTER rounds have passed; a probe (a
    # drafting round) is a measurement: the round after it observes its verification, and it wakes nothing
    assert sim.slept >= (DOZE_EVERY - 1) / DOZE_EVERY * 2000 - DOZE_AFTER - len(drafting)
    assert sim.slept < (DOZE_EVERY - 1) / DOZE_EVERY * 2000 + 1
    # strong matches appear (evidence 4, always accepted): taken within one doze period, and the policy stays awake
    pol.observe_verify(1, 4, 4, evidence=4)         # the engine already knows that class pays
    pol.observe_verify(1, 4, 4, evidence=4)
    slept = sim.slept
    later = [sim.step(seqs, lambda s, k: k, evidence=lambda s: 4) for _ in range(200)]
    first = next(i for i, ks in enumerate(later) if any(ks))
    assert first < DOZE_EVERY
    assert sum(any(ks) for ks in later[first:]) >= len(later[first:]) - 200 // PLAIN_EVERY - 2
    assert sim.slept - slept < DOZE_EVERY           # awake again


def test_a_probes_verification_is_observed_while_dozing():
    """In the engine a round's drafts are verified by the next step and learnt from in the round after it
    (``Speculator.after_step``: ``asleep``, then ``observe_verify``). A probe drafted in an awake round of a doze
    must not be followed by a dozing round, or its verification is lost: its cost buys nothing and the
    acceptance that keeps the sequence at k = 0 never moves."""
    pol = AdaptiveDraftLength(4)
    pending, probes, observed = 0, 0, 0
    for _ in range(3000):
        if pol.asleep():
            pending = 0                                 # what the engine would drop: nothing observes it
            continue
        if pending:
            pol.observe_verify(1, pending, 0)
            observed += 1
        pol.observe_step(1, pending, 0.002 + (0.0005 + 0.0002 * pending if pending else 0.0))
        if pol.plain_step_due(1):
            pending = 0
            continue
        pending = pol.choose(1, 4, 1)
        pol.end_round()
        probes += pending > 0
    assert probes >= 5 and observed >= probes - 1      # every probe's verification reached the policy


def test_a_fixed_policy_never_dozes():
    pol = AdaptiveDraftLength(4, enabled=False)
    for _ in range(3 * DOZE_AFTER):
        assert not pol.asleep()
        pol.end_round()


def test_positions_never_observed_are_no_better_than_the_one_before():
    acceptance, observations = [0.3, 0.9, 0.8, 0.9], [5, 0, 2, 0]
    cap_unobserved(acceptance, observations)
    assert acceptance == [0.3, 0.3, 0.8, 0.8]          # observed positions keep their own estimate
    pol = AdaptiveDraftLength(4)
    pol.observe_verify(1, 4, 0)                         # one rejection at draft 1: E(4) follows it
    a, engine = pol.acceptance(1), pol.global_acceptance[0]
    assert engine[1:] == [engine[0]] * 3 and a[1:] == engine[1:]   # unobserved: the engine's, capped at draft 1
    assert a[0] < engine[0] < PRIOR_ACCEPTANCE
    assert expected_accepted(a, 4) < expected_accepted([a[0]] + [PRIOR_ACCEPTANCE] * 3, 4) / 1.5


def test_an_unobserved_position_follows_the_one_before_back_up():
    """One early rejection at draft 3 lowers drafts 3 and 4 engine-wide; while only 3 drafts are verified (draft 4
    never observed), draft 4's estimate rises with draft 3's again, up to the prior."""
    pol = AdaptiveDraftLength(4)
    pol.observe_verify(1, 4, 2, evidence=8)              # the first verification: draft 3 rejected
    g = pol.global_acceptance[8]
    assert g[3] == g[2] < 0.5
    for _ in range(20):
        pol.observe_verify(1, 3, 3, evidence=8)          # three drafts, all accepted
    assert pol.global_observations[8][3] == 0
    assert g[2] > 0.8 and g[3] == pytest.approx(min(g[2], PRIOR_ACCEPTANCE))


def test_a_sequence_below_its_cap_is_probed_deeper():
    """One rejection at draft 4 must not hold k at 3 for good: positions past k are observed only when drafted,
    so now and then the full k is drafted, and once draft 4 is seen accepted k returns to 4."""
    pol = AdaptiveDraftLength(4)
    sim = Sim(pol, plain=lambda n: 0.002, fixed=0.0002, per_token=0.001)    # a draft token: half a plain step
    first = [True]

    def accept(s, k):                        # the first verification rejects draft 4; later ones accept all
        if first[0] and k == 4:
            first[0] = False
            return 3
        return k

    ks = [sim.step([1], accept)[0] for _ in range(200)]
    at_three = ks.index(3)
    assert 4 in ks[at_three:]                             # a deeper probe, then k = 4 on merit
    assert ks[-20:] == [4] * 20


def test_no_length_is_dearer_than_a_longer_one():
    costs = StepCosts()
    costs.observe_plain(1, 0.002)
    for _ in range(SETTLED):
        costs.observe_speculative(1, 1, 2, 0.0022)       # x(1, 2) = 0.2 ms
    costs.observe_speculative(1, 1, 1, 0.0030)           # one slow step at k = 1: 1 ms
    costs.observe_speculative(1, 1, 1, 0.0030)
    costs.observe_speculative(1, 1, 1, 0.0030)
    assert costs.extra_seconds(1, 1) == pytest.approx(0.0002) and costs.extra_seconds(1, 2) == pytest.approx(0.0002)


def test_all_lengths_at_once_equal_each_length_alone():
    """``extra_seconds_upto`` (read once per round by the policy) gives what ``extra_seconds`` gives per length,
    through unsettled, stale, borrowed-bucket and monotone cases."""
    rng = random.Random(4)
    costs = StepCosts()
    assert costs.extra_seconds_upto(1, 4) == (None, None)
    compared = 0
    for step in range(400):
        b = rng.choice([1, 1, 1, 3, 8])
        if rng.random() < 0.2:
            costs.observe_plain(b, rng.uniform(0.001, 0.003))
        else:
            costs.observe_speculative(b, rng.randint(1, b), rng.choice([1, 2, 4, 4, 6]), rng.uniform(0.001, 0.01))
        n, k_max = rng.choice([1, 2, 3, 8, 32]), rng.choice([1, 4, 6, 8])
        extras, pessimistic = costs.extra_seconds_upto(n, k_max)
        alone = [costs.extra_seconds(n, k) for k in range(1, k_max + 1)]
        assert extras == (None if alone[0] is None else alone)
        assert pessimistic == costs.extra_seconds(n, k_max, optimistic=False)
        compared += extras is not None and extras != [costs.extra_seconds(n, k, optimistic=False)
                                                     for k in range(1, k_max + 1)]
    assert compared >= 10, "the optimistic and pessimistic estimates never differed: the cases were not reached"
