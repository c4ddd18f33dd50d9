"""Intra-op threads per step on the CPU: more threads only where they measurably help.

On a small CPU shared with the rest of the server, an OpenMP barrier per op makes a second thread
slower for small steps (a descheduled thread stalls every op) while large prefill steps gain from it.
So the engine picks, per step, between 1 thread and ``cpu_threads`` by step size: steps are bucketed
by their token count (powers of two), each bucket keeps an exponential average of seconds per step
for each thread count, both are tried first, the faster one is used after that, and the slower one
is re-tried every ``RETRY_EVERY`` steps of the bucket (costs drift with the machine's load).
``torch.set_num_threads`` costs well under a microsecond.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

DECAY = 0.2
RETRY_EVERY = 50


def bucket(num_tokens: int) -> int:
    return 1 << max(0, num_tokens - 1).bit_length()


@dataclass
class ThreadPolicy:
    max_threads: int
    _seconds: dict[tuple[int, int], float] = field(default_factory=dict)   # (bucket, threads) -> EMA
    _steps: dict[int, int] = field(default_factory=dict)                  # bucket -> steps seen
    _current: int = 0

    @property
    def active(self) -> bool:
        return self.max_threads > 1

    def choose(self, num_tokens: int) -> int:
        """Threads for a step of ``num_tokens`` tokens (set on torch before the forward)."""
        if not self.active:
            return self.max_threads
        b = bucket(num_tokens)
        n = self._steps.get(b, 0)
        self._steps[b] = n + 1
        options = (1, self.max_threads)
        unseen = [t for t in options if (b, t) not in self._seconds]
        if unseen:
            threads = unseen[0]
        else:
            best = min(options, key=lambda t: self._seconds[(b, t)])
            threads = (options[1] if best == options[0] else options[0]) if n % RETRY_EVERY == 0 else best
        if threads != self._current:
            torch.set_num_threads(threads)
            self._current = threads
        return threads

    def observe(self, num_tokens: int, threads: int, seconds: float) -> None:
        if not self.active:
            return
        key = (bucket(num_tokens), threads)
        old = self._seconds.get(key)
        self._seconds[key] = seconds if old is None else old + DECAY * (seconds - old)
