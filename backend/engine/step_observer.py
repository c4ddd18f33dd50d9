"""What measures or tunes an engine step attaches to it as a ``StepObserver``.

``LLMEngine.step()`` only admits, schedules, runs the forward, samples, applies and streams; the thread
policy, the stream pacer, the sequences' timelines and the speculator's step clock watch it at four points,
called in the order the observers were given:
- ``before(plan)``: the plan is made, the forward has not started;
- ``sampled(plan, output)``: the tokens are sampled and the grammar matchers advanced, before the scheduler
  applies them;
- ``after(plan, output, start)``: the step is over (outputs dispatched, forced tokens appended); ``start``
  holds the clocks read when ``step()`` began, so the whole iteration is what gets measured;
- ``idle()``: no request is left to schedule.
"""
from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from backend.core.plan import ModelRunnerOutput, SchedulerOutput


@dataclass(frozen=True)
class StepStart:
    """The clocks at the start of ``step()``: wall (``time.perf_counter``) and the loop thread's CPU time."""

    wall: float
    cpu: float

    @classmethod
    def now(cls) -> StepStart:
        return cls(time.perf_counter(), time.thread_time())


class StepObserver:
    """One piece of instrumentation around the step; every hook does nothing unless overridden."""

    def before(self, plan: SchedulerOutput) -> None:
        pass

    def sampled(self, plan: SchedulerOutput, output: ModelRunnerOutput) -> None:
        pass

    def after(self, plan: SchedulerOutput, output: ModelRunnerOutput, start: StepStart) -> None:
        pass

    def idle(self) -> None:
        pass


class StepObservers(StepObserver):
    """Several observers as one, each hook called on each of them in order."""

    def __init__(self, observers: Iterable[StepObserver]):
        self.observers = list(observers)

    def before(self, plan: SchedulerOutput) -> None:
        for o in self.observers:
            o.before(plan)

    def sampled(self, plan: SchedulerOutput, output: ModelRunnerOutput) -> None:
        for o in self.observers:
            o.sampled(plan, output)

    def after(self, plan: SchedulerOutput, output: ModelRunnerOutput, start: StepStart) -> None:
        for o in self.observers:
            o.after(plan, output, start)

    def idle(self) -> None:
        for o in self.observers:
            o.idle()
