"""``PacerObserver``: each step's sampled tokens to the scheduler's stream pacer (backend/core/stream_pacer.py)."""
from __future__ import annotations

import time

from backend.core.plan import ModelRunnerOutput, SchedulerOutput
from backend.core.stream_pacer import StreamPacer
from backend.engine.step_observer import StepObserver


class PacerObserver(StepObserver):
    """Feeds each step's sampled tokens to the pacer (the scheduler's, which streams the step with the interval
    it chooses) before the scheduler applies the step; an idle engine restarts the pacer's rate measurement."""

    def __init__(self, pacer: StreamPacer):
        self.pacer = pacer

    def sampled(self, plan: SchedulerOutput, output: ModelRunnerOutput) -> None:
        self.pacer.observe(time.perf_counter(), sum(map(len, output.sampled_token_ids)))

    def idle(self) -> None:
        self.pacer.idle()
