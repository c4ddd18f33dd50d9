"""Per-step CPU threads: try both, keep the faster per step size, re-try the other now and then."""
from __future__ import annotations

import torch

from backend.engine.thread_policy import RETRY_EVERY, ThreadPolicy


def test_single_thread_engines_never_switch():
    p = ThreadPolicy(1)
    assert [p.choose(n) for n in (1, 64, 512)] == [1, 1, 1]


def test_each_size_uses_the_faster_count():
    before = torch.get_num_threads()
    try:
        p = ThreadPolicy(2)
        for size, fast in ((1, 1), (256, 2)):
            seen = set()
            for _ in range(2):                      # both counts tried first
                t = p.choose(size)
                seen.add(t)
                p.observe(size, t, 0.001 if t == fast else 0.003)
            assert seen == {1, 2}
            picks = [p.choose(size) for _ in range(RETRY_EVERY)]
            assert picks.count(fast) >= RETRY_EVERY - 2 and set(picks) == {1, 2}   # a retry of the slower
            assert torch.get_num_threads() == picks[-1]
    finally:
        torch.set_num_threads(before)
