"""Adaptive stream interval: how many tokens a sequence's streamed response may hold back.

Every streamed response costs Python time downstream (the llm model's send, postprocess, the
client), independent of how many tokens it carries. The pacer caps the responses the engine sends
per second: with the engine producing ``r`` tokens per second (measured, an exponential average
over steps) and a budget of ``R`` responses per second (``stream_responses_per_s``), each response
carries ``ceil(r / R)`` tokens, clamped to ``[1, stream_interval]``. So a lightly loaded engine
streams every token, and a busy one batches more tokens per response instead of starving the
forward of CPU. A sequence's first token and its last always go out at once. With
``stream_responses_per_s = 0`` the interval is the fixed ``stream_interval``.

The scheduler owns its pacer and streams with ``current``; the engine feeds it each step's sampled tokens
(``PacerObserver``, backend/engine/pacer_observer.py) before the scheduler applies the step.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

DECAY = 0.2   # weight of the newest step in the tokens-per-second average


@dataclass
class StreamPacer:
    max_interval: int                   # stream_interval: the most tokens a response may hold back
    responses_per_s: float              # budget; 0 = fixed interval
    tokens_per_s: float = 0.0
    _last: float | None = None
    current: int = field(init=False)    # the interval the last ``observe`` chose (``max_interval`` before one)

    def __post_init__(self) -> None:
        self.current = self.max_interval

    @property
    def interval(self) -> int:
        if self.responses_per_s <= 0:
            return self.max_interval
        # a little slack, so a rate that sits on a multiple of the budget does not flap up a step
        return max(1, min(self.max_interval, math.ceil(self.tokens_per_s / self.responses_per_s - 0.05)))

    def observe(self, now: float, new_tokens: int) -> int:
        """A step finished at ``now`` with ``new_tokens`` output tokens; returns the interval to use."""
        if self._last is not None and now > self._last:
            rate = new_tokens / (now - self._last)
            self.tokens_per_s += DECAY * (rate - self.tokens_per_s) if self.tokens_per_s else rate
        self._last = now
        self.current = self.interval
        return self.current

    def idle(self) -> None:
        """The engine went idle: the next step's rate is measured from its own start."""
        self._last = None
