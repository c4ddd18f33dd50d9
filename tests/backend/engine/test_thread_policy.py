"""Per-step CPU threads: probe both counts over a window of steps, keep the faster per step size, re-probe."""
from __future__ import annotations

import pytest
import torch

from backend.engine.thread_policy import (ABORT, MARGIN, MAX_RETRY_EVERY, PROBE_RUN, RETRY_EVERY, WIDE_START_MACS,
                                         ThreadPolicy, matrix_elements)


@pytest.fixture(autouse=True)
def _restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def run(policy: ThreadPolicy, size: int, steps: int, cost) -> list[int]:
    """``steps`` steps of ``size`` tokens, step i of a count t taking ``cost(t, i)`` seconds; the counts chosen."""
    picks = []
    for i in range(steps):
        t = policy.choose(size)
        picks.append(t)
        policy.observe(size, t, cost(t, i))
    return picks


def test_single_thread_engines_never_switch():
    p = ThreadPolicy(1)
    assert [p.choose(n) for n in (1, 64, 512)] == [1, 1, 1]


def test_each_size_uses_the_faster_count_after_its_probe():
    p = ThreadPolicy(2)
    # one thread first (the choice before any probe); two threads 3x slower at size 1: their run stops after
    # its warm-up and two counted steps; 3x faster at 256: a whole run
    for size, best, probe in ((1, 1, [1] * PROBE_RUN + [2] * 3), (256, 2, [1] * PROBE_RUN + [2] * PROBE_RUN)):
        picks = run(p, size, 2 * PROBE_RUN + 50, lambda t, i, best=best: 0.001 if t == best else 0.003)
        assert picks[:len(probe)] == probe
        assert set(picks[len(probe):]) == {best}
        assert torch.get_num_threads() == best


def test_outliers_and_warm_up_steps_do_not_decide():
    """Two threads are faster; the first step of each run (threads waking up) and one descheduled step in the
    middle of the two-thread run are very slow: the medians still pick two threads."""
    p = ThreadPolicy(2)
    slow = {0, PROBE_RUN, PROBE_RUN + 2}

    def cost(t, i):
        return 1.0 if i in slow else (0.001 if t == 2 else 0.0015)

    picks = run(p, 1, 2 * PROBE_RUN + 20, cost)
    assert picks[:2 * PROBE_RUN] == [1] * PROBE_RUN + [2] * PROBE_RUN   # the current choice first
    assert set(picks[2 * PROBE_RUN:]) == {2}


def test_a_probe_stops_a_run_that_has_lost():
    """With the second core taken, two-thread steps are 100x slower: the probe leaves them after two counted
    steps (and the warm-up) instead of a whole run."""
    p = ThreadPolicy(2)
    picks = run(p, 1, 2 * PROBE_RUN + 20, lambda t, i: 0.1 if t == 2 else 0.001)
    assert picks[:PROBE_RUN + 3] == [1] * PROBE_RUN + [2] * 3
    assert set(picks[PROBE_RUN + 3:]) == {1}


def test_a_gain_within_the_margin_keeps_one_thread():
    p = ThreadPolicy(2)
    picks = run(p, 1, 2 * PROBE_RUN + 10, lambda t, i: 0.001 * (1 - MARGIN / 2) if t == 2 else 0.001)
    assert set(picks[2 * PROBE_RUN:]) == {1}


def test_re_probes_every_retry_every_steps_and_follows_a_change():
    p = ThreadPolicy(2)
    # the first probe's two-thread run stops after 3 steps (2x slower than one thread, ABORT 1.5)
    change, reprobe = 2 * PROBE_RUN + 10, PROBE_RUN + 3 + RETRY_EVERY
    picks = run(p, 8, reprobe + 2 * PROBE_RUN + 10, lambda t, i: (0.001 if t == 1 else 0.002) if i < change
                else (0.002 if t == 1 else 0.001))
    assert set(picks[PROBE_RUN + 3:reprobe]) == {1}      # one thread got slower: it waits for the next probe
    assert picks[reprobe:reprobe + 2 * PROBE_RUN] == [1] * PROBE_RUN + [2] * PROBE_RUN
    assert set(picks[reprobe + 2 * PROBE_RUN:]) == {2}


def probe_starts(picks: list[int]) -> list[int]:
    """Where each probe's two-thread run begins (one thread is the choice throughout)."""
    return [i for i in range(1, len(picks)) if picks[i] == 2 and picks[i - 1] == 1]


def test_re_probes_that_confirm_the_choice_back_off():
    """A steady machine: every re-probe finds one thread faster again, and the interval doubles up to
    MAX_RETRY_EVERY; a probe that changes the choice starts the interval over."""
    p = ThreadPolicy(2)
    picks = run(p, 1, 12_000, lambda t, i: 0.001 if t == 1 else 0.0013)   # within ABORT: whole runs
    starts = probe_starts(picks)
    gaps = [b - a - PROBE_RUN - PROBE_RUN for a, b in zip(starts, starts[1:])]   # steady steps between probes
    assert gaps[:5] == [RETRY_EVERY, 2 * RETRY_EVERY, 4 * RETRY_EVERY, 8 * RETRY_EVERY, MAX_RETRY_EVERY]
    assert all(g == MAX_RETRY_EVERY for g in gaps[4:])
    assert 0.0013 < ABORT * 0.001
    # now two threads become faster: the next probe switches, and the one after comes RETRY_EVERY later
    t0 = len(picks)
    picks += run(p, 1, MAX_RETRY_EVERY + 3 * RETRY_EVERY, lambda t, i: 0.001 if t == 2 else 0.0013)
    switched = picks.index(2, t0)
    assert switched - t0 <= MAX_RETRY_EVERY
    after = picks[switched + PROBE_RUN:]
    assert after[:RETRY_EVERY] == [2] * RETRY_EVERY and 1 in after[RETRY_EVERY:RETRY_EVERY + 2 * PROBE_RUN]


def test_buckets_are_independent():
    p = ThreadPolicy(2)
    run(p, 1, 2 * PROBE_RUN, lambda t, i: 0.001 if t == 1 else 0.002)
    run(p, 32, 2 * PROBE_RUN, lambda t, i: 0.001 if t == 2 else 0.002)
    assert p.choose(1) == 1 and p.choose(20) == 2    # 20 tokens share the 32-token bucket


def test_a_slowdown_of_the_choice_re_probes_at_once():
    """Two threads chosen, then another process takes the second core: two-thread steps become 100x slower; the
    policy re-probes after PROBE_RUN such steps, not RETRY_EVERY, and switches to one thread."""
    p = ThreadPolicy(2)
    start = 2 * PROBE_RUN + 10
    picks = run(p, 1, start + 4 * PROBE_RUN, lambda t, i: (0.001 if t == 2 else 0.0015) if i < start
                else (0.1 if t == 2 else 0.0015))
    assert set(picks[2 * PROBE_RUN:start]) == {2}
    noticed = picks.index(1, start)                                   # a probe of one thread only
    assert noticed - start <= PROBE_RUN                               # within a window of slow steps
    assert set(picks[noticed:]) == {1}


def test_large_steps_start_on_every_thread_and_small_ones_on_one():
    """Before its first probe a bucket runs one thread, unless its steps multiply WIDE_START_MACS weights or more:
    then every thread, with no probe until the first scheduled re-probe, which still decides."""
    p = ThreadPolicy(2, macs_per_token=WIDE_START_MACS // 8)
    small = run(p, 4, PROBE_RUN, lambda t, i: 0.001)
    large = run(p, 8, RETRY_EVERY + 2 * PROBE_RUN + 5, lambda t, i: 0.001 if t == 1 else 0.003)
    assert small == [1] * PROBE_RUN
    assert large[:RETRY_EVERY + PROBE_RUN] == [2] * (RETRY_EVERY + PROBE_RUN)   # steady, then the probe's run
    assert set(large[RETRY_EVERY + 2 * PROBE_RUN:]) == {1}                       # one thread won
    assert ThreadPolicy(2).choose(4096) == 1                                     # size unknown: one


def test_a_wide_start_reprobes_when_it_slows_down():
    """The first steps of a wide start are its reference: steps SLOWDOWN times slower start a probe of one thread."""
    p = ThreadPolicy(2, macs_per_token=WIDE_START_MACS)
    picks = run(p, 1, 3 * PROBE_RUN, lambda t, i: 0.001 if i < PROBE_RUN or t == 1 else 0.01)
    first_one = picks.index(1)
    assert PROBE_RUN + PROBE_RUN // 2 <= first_one <= 2 * PROBE_RUN and set(picks[first_one:]) == {1}


def test_matrix_elements_counts_the_weights_a_token_multiplies():
    model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
    model.register_buffer("packed", torch.zeros(6, 2, dtype=torch.uint8))
    assert matrix_elements(model) == 10 * 4 + 4 * 3 + 6 * 2
