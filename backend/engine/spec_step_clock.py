"""The speculator's turn after each step, with the step's cost on the clock that measures it.

``Speculator.after_step(scheduler, plan, output, seconds, clock)`` learns from the step's verifications and
time and proposes the next plan's drafts (backend/spec_decode/speculator.py). ``seconds`` covers the whole
iteration from the start of ``step()``: scheduling and emitting outputs are paid once per step, so fewer,
longer steps save them too. On one CPU thread it is the loop thread's CPU time (the work the step did, not
what other processes took: ``clock`` is ``time.thread_time``), otherwise wall time (``time.perf_counter``).
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

from backend.core.plan import ModelRunnerOutput, SchedulerOutput
from backend.engine.step_observer import StepObserver, StepStart
from backend.engine.thread_policy import ThreadObserver

if TYPE_CHECKING:  # pragma: no cover
    from backend.core.scheduler import Scheduler


class SpeculatorObserver(StepObserver):
    def __init__(self, speculator, scheduler: Scheduler, threads: ThreadObserver, on_cpu: bool):
        self.speculator, self.scheduler = speculator, scheduler
        self.threads = threads      # the current step's thread count
        self.on_cpu = on_cpu        # steps end on the loop thread (CPU device): its CPU time is the step's work

    def after(self, plan: SchedulerOutput, output: ModelRunnerOutput, start: StepStart) -> None:
        one_thread = self.on_cpu and self.threads.threads == 1
        clock = time.thread_time if one_thread else time.perf_counter
        seconds = clock() - (start.cpu if one_thread else start.wall)
        self.speculator.after_step(self.scheduler, plan, output, seconds, clock)
