"""The speculation governor (backend/spec_decode/governor.py): epochs with and without speculation, compared by
their realized goodput, choose whether to speculate; the other arm is re-tried at doubling intervals and a
changed workload is followed within a few re-tries."""
from __future__ import annotations

import math

import pytest

from backend.config import EngineConfig
from backend.core.sequence import Sequence
from backend.engine.llm_engine import LLMEngine
from backend.spec_decode import governor as governor_module
from backend.spec_decode.governor import (
    DECISIVE,
    EPOCH_STEPS,
    EXPLORE_BUDGET,
    EXPLORE_EVERY,
    EXPLORE_MAX,
    SETTLE,
    WARMUP_STEPS,
    SpeculationGovernor,
    _Bucket,
    epoch_steps,
    log_goodput_ratio,
    retry_floor,
)
from backend.spec_decode.speculator import evidence_class
from contracts.sampling_params import SamplingParams
from tests.helpers.oracle import repeating_prompts


def drive(gov: SpeculationGovernor, steps: int, on_speed: float, off_speed: float = 1.0, num_seqs: int = 1,
          drift=lambda i: 1.0, sampled: bool = False) -> list[bool]:
    """``steps`` engine steps of ``num_seqs`` sequences: one token per sequence a step, taking 1 / speed seconds
    per token in the arm of the step (times ``drift(i)``, the machine's speed); the arm of every step."""
    arms = []
    for i in range(steps):
        on = gov.speculating()
        arms.append(on)
        speed = on_speed if on else off_speed
        gov.observe(num_seqs, num_seqs, drift(i) * num_seqs / speed, sampled)
    return arms


def test_epochs_are_shorter_at_large_batches():
    assert epoch_steps(1) == EPOCH_STEPS and epoch_steps(2) == EPOCH_STEPS // 2
    assert epoch_steps(32) == epoch_steps(64) < epoch_steps(2)


def test_the_sample_is_the_log_of_the_goodput_ratio():
    assert log_goodput_ratio(2.0, 1.0) == pytest.approx(math.log(2.0))
    assert log_goodput_ratio(1.0, 1.0) == 0.0


def test_speculation_that_pays_stays_on_but_for_rare_re_tries():
    gov = SpeculationGovernor()
    arms = drive(gov, 400 * EPOCH_STEPS, on_speed=1.8)
    assert arms[0]                                                   # on first
    assert gov.snapshot()[1]["on"] and gov.snapshot()[1]["log_ratio"] == pytest.approx(math.log(1.8))
    late = arms[len(arms) // 2:]
    floor = retry_floor(math.log(1.8))                              # each re-try loses 44% of an epoch
    assert floor > EXPLORE_MAX and (1 - 1 / 1.8) / floor <= EXPLORE_BUDGET
    assert late.count(False) / len(late) < 1.1 / (floor + 1)        # one re-try epoch per budgeted interval
    assert gov._buckets[(1, False)].explore_every == floor


def test_speculation_that_costs_is_turned_off():
    gov = SpeculationGovernor()
    arms = drive(gov, 400 * EPOCH_STEPS, on_speed=0.88)
    assert not gov.snapshot()[1]["on"] and gov.snapshot()[1]["log_ratio"] == pytest.approx(math.log(0.88))
    late = arms[len(arms) // 2:]
    assert late.count(True) / len(late) < 1.3 / (EXPLORE_MAX + 1)   # a re-try epoch has WARMUP_STEPS more


def epoch_arms(gov: SpeculationGovernor) -> list[bool]:
    """The arm of every epoch the governor starts from now on."""
    arms, start = [], gov._start

    def recording(*args):
        ep = start(*args)
        arms.append(ep.on)
        return ep

    gov._start = recording
    return arms


def test_arms_alternate_until_settled_then_follow_the_samples():
    gov = SpeculationGovernor()
    arms = epoch_arms(gov)
    assert abs(math.log(0.8)) < DECISIVE
    drive(gov, 80 * (EPOCH_STEPS + WARMUP_STEPS), on_speed=0.8)
    # on, off, on, off: a sample from each run that follows a run of the other arm, taken when that run ends
    assert arms[:SETTLE + 2] == [True, False, True, False][:SETTLE + 2]
    # decided: off, for as long as re-tries of a choice worth 1.25x stay within their budget; then one re-try
    wait = max(EXPLORE_EVERY, retry_floor(math.log(0.8)))
    assert wait > EXPLORE_EVERY
    assert arms[SETTLE + 2:SETTLE + 2 + wait] == [False] * wait
    assert arms[SETTLE + 2 + wait] is True


def test_one_decisive_sample_for_speculation_settles():
    """A first sample that says speculating is at least 1.5x faster settles the bucket at once: on, off, on, then
    speculation, without a second epoch without it; the budgeted re-try follows."""
    gov = SpeculationGovernor()
    arms = epoch_arms(gov)
    wait = max(EXPLORE_EVERY, retry_floor(math.log(2.0)))
    drive(gov, (wait + 8) * (EPOCH_STEPS + WARMUP_STEPS), on_speed=2.0)
    assert arms[:3] == [True, False, True]
    assert arms[3:3 + wait] == [True] * wait and arms[3 + wait] is False


def test_a_first_sample_against_speculation_is_not_decisive():
    """The first epoch with speculation carries one-off costs, so a first sample against it, however large, waits
    for the second: on, off, on, off, as for a small difference."""
    against, for_ = _Bucket(), _Bucket()
    against.add_sample(math.log(0.5))
    for_.add_sample(math.log(2.0))
    assert not against.settled and for_.settled and for_.choice
    against.add_sample(math.log(0.5))                    # the second sample settles it
    assert against.settled and not against.choice
    gov = SpeculationGovernor()
    arms = epoch_arms(gov)
    drive(gov, 12 * (EPOCH_STEPS + WARMUP_STEPS), on_speed=0.5)
    assert arms[:4] == [True, False, True, False] and not any(arms[4:])


def test_a_change_of_workload_is_followed_within_a_few_re_tries():
    gov = SpeculationGovernor()
    drive(gov, 2000 * EPOCH_STEPS // 10, on_speed=2.0)              # greedy code: speculating doubles throughput
    assert gov.speculating() and gov._buckets[(1, False)].explore_every == retry_floor(math.log(2.0))
    arms = drive(gov, 2000 * EPOCH_STEPS // 10, on_speed=0.85)     # sampled prose: it costs 15%
    switched = arms.index(False, arms.index(False) + 1) if arms.count(False) > 1 else None
    # the first re-try comes within the longest interval (the budgeted one of a 2x gain); from its disagreeing
    # sample on, re-tries come every EXPLORE_EVERY epochs until the mean crosses over
    longest = max(EXPLORE_MAX, retry_floor(math.log(2.0)))
    assert switched is not None and switched < (longest + 6 * (EXPLORE_EVERY + 1)) * (EPOCH_STEPS + 1)
    assert not gov.speculating()
    last = arms[-50 * EPOCH_STEPS:]
    assert last.count(True) / len(last) < 0.05


def test_only_neighbouring_epochs_compare_so_slow_drift_cancels():
    # the machine slows down 3x over the run; speculating is worth 1.25x throughout
    gov = SpeculationGovernor()
    n = 300 * EPOCH_STEPS
    drive(gov, n, on_speed=1.25, drift=lambda i: 1.0 + 2.0 * i / n)
    assert gov.snapshot()[1]["on"]
    assert gov.snapshot()[1]["log_ratio"] == pytest.approx(math.log(1.25), abs=0.05)


def test_buckets_are_judged_apart_and_short_epochs_say_nothing():
    gov = SpeculationGovernor()
    drive(gov, 40 * EPOCH_STEPS, on_speed=2.0, num_seqs=1)
    drive(gov, 40 * EPOCH_STEPS, on_speed=0.8, num_seqs=32)
    snap = gov.snapshot()
    assert snap[1]["on"] and not snap[32]["on"]
    drive(gov, 1, on_speed=2.0, num_seqs=4)          # closes the epoch going on at 32
    samples = gov.snapshot()[32]["samples"]
    for _ in range(10):                             # the batch flips bucket before half an epoch is measured
        drive(gov, epoch_steps(32) // 2 - 1, on_speed=2.0, num_seqs=32)
        drive(gov, epoch_steps(4) // 2 - 1, on_speed=2.0, num_seqs=4)
    assert gov.snapshot()[32]["samples"] == samples and 4 not in {b for b, s in gov.snapshot().items() if s["samples"]}


def test_sampled_and_greedy_steps_are_judged_apart():
    """A bucket where speculating costs sampled requests 40% and doubles greedy ones' throughput: each kind of step
    settles on its own arm, and a long sampled stretch does not carry its choice into the greedy one after it."""
    gov = SpeculationGovernor()
    drive(gov, 200 * EPOCH_STEPS, on_speed=0.6, sampled=True)
    assert not gov.snapshot(sampled=True)[1]["on"] and 1 not in gov.snapshot()
    arms = drive(gov, 200 * EPOCH_STEPS, on_speed=2.0)
    assert gov.snapshot()[1]["on"] and not gov.snapshot(sampled=True)[1]["on"]
    # greedy steps start afresh, on first (from the step after the first: that one's arm was the sampled epoch's)
    assert arms[1:EPOCH_STEPS] == [True] * (EPOCH_STEPS - 1)


def test_disabled_always_speculates_and_learns_nothing():
    gov = SpeculationGovernor(enabled=False)
    assert all(drive(gov, 20 * EPOCH_STEPS, on_speed=0.5)) and gov.snapshot() == {}


def test_the_explore_interval_starts_short():
    gov = SpeculationGovernor()
    drive(gov, (SETTLE + 1) * (EPOCH_STEPS + 1), on_speed=3.0)
    assert gov._buckets[(1, False)].explore_every == EXPLORE_EVERY


def test_engine_runs_epochs_of_both_arms_and_every_block_comes_back(tiny_checkpoint):
    """End to end: the governor's epochs run in the engine (on, then off, then as the samples say), the step after
    an epoch change verifies the drafts proposed before it, and no KV block is left behind. Greedy output stays
    exact with the governor on (test_spec_oracle.py runs adaptive engines)."""
    engine = LLMEngine(EngineConfig(model_path=str(tiny_checkpoint), device="cpu", kv_cache_bytes=16 << 20,
                                    speculative_method="ngram"))
    gov = engine.speculator.governor
    arms = []
    speculating = gov.speculating

    def record():
        on = speculating()
        arms.append(on)
        return on

    gov.speculating = record
    outs = engine.generate(repeating_prompts(4, 3, stem_len=8, span_range=(4, 8), gap_range=(0, 4)),
                           SamplingParams(max_tokens=160, temperature=1.0, seed=3))
    assert all(sum(len(o.new_token_ids) for o in req) == 160 for req in outs)
    assert True in arms and False in arms                            # both arms ran in the engine
    assert any(s["samples"] for s in gov.snapshot(sampled=True).values())   # and were compared (sampled steps)
    assert 0 < engine.stats().spec.num_standby_steps < engine.stats().steps   # counted for the metrics
    assert engine.scheduler.block_manager.num_used_blocks == 0


def test_greedy_output_is_exact_across_epochs_of_both_arms(tiny_checkpoint, monkeypatch):
    """Greedy requests long enough for several epochs of each arm (the transitions included: an epoch without
    speculation whose first step verifies drafts, speculation resuming with a woken policy) give the output of an
    engine without speculation, token for token, and free every block. (No sample settles the arms alone here:
    they alternate for two samples, so both transitions happen twice.)"""
    monkeypatch.setattr(governor_module, "DECISIVE", math.inf)
    prompts = repeating_prompts(3, 5, stem_len=8, span_range=(4, 8), gap_range=(0, 4))
    params = SamplingParams(max_tokens=200, temperature=0.0)
    plain = LLMEngine(EngineConfig(model_path=str(tiny_checkpoint), device="cpu", kv_cache_bytes=16 << 20))
    want = [[t for o in req for t in o.new_token_ids] for req in plain.generate(prompts, params)]
    engine = LLMEngine(EngineConfig(model_path=str(tiny_checkpoint), device="cpu", kv_cache_bytes=16 << 20,
                                    speculative_method="ngram"))
    arms = epoch_arms(engine.speculator.governor)
    got = [[t for o in req for t in o.new_token_ids] for req in engine.generate(prompts, params)]
    assert got == want
    assert arms.count(True) >= 2 and arms.count(False) >= 2                # both arms, and changes between them
    assert engine.scheduler.spec_counters.num_draft_tokens > 0
    assert engine.scheduler.block_manager.num_used_blocks == 0


def test_greedy_and_sampled_requests_learn_acceptance_apart(tiny_checkpoint):
    """The policy's evidence classes keep greedy and sampled requests apart (``evidence_class``): the same n-gram
    match is accepted far less often by a sampled request, and pooled, a sampled workload set the estimates every
    later greedy request started from."""
    seq = lambda t: Sequence(seq_id=1, request_id="r", seq_index=0, prompt_token_ids=[3],
                             params=SamplingParams(temperature=t))
    assert evidence_class(seq(0.0), 4) == 8 and evidence_class(seq(0.8), 4) == 9 and evidence_class(seq(1.0), 0) == 1
    engine = LLMEngine(EngineConfig(model_path=str(tiny_checkpoint), device="cpu", kv_cache_bytes=16 << 20,
                                    speculative_method="ngram"))
    engine.speculator.governor.enabled = False          # every step speculates: both phases reach the policy
    prompts = repeating_prompts(4, 3, stem_len=8, span_range=(4, 8), gap_range=(0, 4))
    engine.generate(prompts[:2], SamplingParams(max_tokens=64, temperature=0.0))
    greedy = set(engine.speculator.policy.global_acceptance)
    # (a low temperature: the random model's sampled output still repeats, so n-gram drafts are found)
    engine.generate(prompts[2:], SamplingParams(max_tokens=64, temperature=0.3, seed=5))
    sampled = set(engine.speculator.policy.global_acceptance) - greedy
    assert greedy and sampled and all(c % 2 == 0 for c in greedy) and all(c % 2 == 1 for c in sampled)
    pol = engine.speculator.policy               # and the step costs: greedy steps' apart from sampled ones'
    assert pol.costs.snapshot()[1] and pol.sampled_costs.snapshot()[1]
    assert engine.scheduler.block_manager.num_used_blocks == 0


def test_sampled_sequences_idle_at_k_0_are_not_looked_up(tiny_checkpoint):
    """A sampled sequence the policy holds at k = 0 for its last lookup's class skips its lookups until its probe
    is due; greedy sequences are looked up every round. Output and blocks as ever."""
    engine = LLMEngine(EngineConfig(model_path=str(tiny_checkpoint), device="cpu", kv_cache_bytes=16 << 20,
                                    speculative_method="ngram"))
    sp = engine.speculator
    sp.governor.enabled = False
    looked, decoding, propose = [], [], sp.proposer.propose
    choose = sp._proposal

    def recording_proposal(scheduler, seqs, clock):
        decoding.append(len(seqs))
        return choose(scheduler, seqs, clock)

    def recording_propose(seqs, ks, grammar=None):
        looked.append(len(seqs))
        return propose(seqs, ks, grammar)

    sp._proposal, sp.proposer.propose = recording_proposal, recording_propose
    prompts = repeating_prompts(4, 3, stem_len=8, span_range=(4, 8), gap_range=(0, 4))
    outs = engine.generate(prompts, SamplingParams(max_tokens=96, temperature=1.0, seed=7))
    assert all(sum(len(o.new_token_ids) for o in req) == 96 for req in outs)
    assert sum(looked) < sum(decoding)                  # some rounds skipped some sequences' lookups
    assert engine.scheduler.block_manager.num_used_blocks == 0 and not sp._last_class
    looked.clear(), decoding.clear()
    engine.generate(prompts, SamplingParams(max_tokens=48, temperature=0.0))
    assert looked == decoding                           # greedy: every decoding sequence, every round
