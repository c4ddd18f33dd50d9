"""Per-step CPU threads: probe both counts over a window of steps, keep the faster per step size, re-probe."""
from __future__ import annotations

import pytest
import torch

from backend.engine.thread_policy import MARGIN, PROBE_RUN, RETRY_EVERY, ThreadPolicy


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
    fast = {1: 1, 256: 2}
    for size, best in fast.items():
        picks = run(p, size, 2 * PROBE_RUN + 50, lambda t, i, best=best: 0.001 if t == best else 0.003)
        assert sorted(picks[:2 * PROBE_RUN]) == [1] * PROBE_RUN + [2] * PROBE_RUN   # both probed, in runs
        assert set(picks[2 * PROBE_RUN:]) == {best}
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
    change, reprobe = 2 * PROBE_RUN + 10, 2 * PROBE_RUN + RETRY_EVERY
    picks = run(p, 8, reprobe + 2 * PROBE_RUN + 10, lambda t, i: (0.001 if t == 1 else 0.002) if i < change
                else (0.002 if t == 1 else 0.001))
    assert set(picks[2 * PROBE_RUN:reprobe]) == {1}      # one thread got slower: it waits for the next probe
    assert picks[reprobe:reprobe + 2 * PROBE_RUN] == [1] * PROBE_RUN + [2] * PROBE_RUN
    assert set(picks[reprobe + 2 * PROBE_RUN:]) == {2}


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
