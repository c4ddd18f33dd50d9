"""The inter-token latency, measured once per engine decode step.

``triton_llm_inter_token_latency_seconds`` is a Triton histogram family, and Triton's Python API observes
one value per call, each a round trip to the server process with the GIL held (~20 us of CPU). One
observation per generated token would cost that for every token of every sequence. So the engine's steps
are watched instead: ``DecodeGaps``, a ``StepObserver`` attached to the engine after its timeline observer,
records for each step that gives an already-started sequence new tokens the time since that sequence's
previous token (vLLM's definition: the gap between consecutive outputs of a sequence; a speculative step's
tokens arrive together, after one gap). Every sequence decoding in both steps saw that same gap, so one
value per step stands for the step: the first such sequence of the plan is the one measured.
``EngineMetrics`` observes the recorded gaps on its own thread (``drain``): one round trip per decode
step, however many sequences the step decodes.

The loop's cost: a scan of the plan up to its first decoding sequence (the running sequences come first)
and one append per step. The buffer is bounded (``max_pending``); gaps beyond it are counted in
``dropped``, not kept.
"""
from __future__ import annotations

from collections import deque

from backend.core.plan import ModelRunnerOutput, SchedulerOutput
from backend.engine.step_observer import StepObserver


class DecodeGaps(StepObserver):
    """Seconds between a sequence's consecutive token steps, one value per decode step; ``drain()`` takes them."""

    def __init__(self, max_pending: int = 100_000):
        if max_pending < 1:
            raise ValueError(f"max_pending: must be at least 1, got {max_pending}")
        self._gaps: deque[float] = deque()
        self._max = max_pending
        self._seq = None
        self._prev = 0.0
        self.dropped = 0

    def before(self, plan: SchedulerOutput) -> None:
        self._seq = None
        for s in plan.scheduled:
            last = s.seq.timeline.last_token
            if last is not None:          # has its first token: this step may give it the next ones
                self._seq, self._prev = s.seq, last
                return

    def sampled(self, plan: SchedulerOutput, output: ModelRunnerOutput) -> None:
        """After the timeline observer: the measured sequence's ``last_token`` is this step's if it got tokens."""
        seq, self._seq = self._seq, None
        if seq is None:
            return
        now = seq.timeline.last_token
        if now is not None and now != self._prev:
            if len(self._gaps) >= self._max:
                self.dropped += 1
                return
            self._gaps.append(now - self._prev)

    def drain(self) -> list[float]:
        """The gaps recorded since the last call (any thread; the loop keeps appending meanwhile)."""
        out = []
        pop = self._gaps.popleft
        try:
            while True:
                out.append(pop())
        except IndexError:
            return out
