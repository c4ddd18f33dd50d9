"""Per-sequence timestamps around each step, written into ``Sequence.timeline`` by the engine loop.

``mark_scheduled`` runs before the forward, ``mark_step_done`` after sampling and before the scheduler
applies the step (so a request finishing in this step reports it); ``TimelineObserver`` attaches both to
the step (backend/engine/step_observers.py). ``RequestState.emit`` stamps a sequence's end and builds the
finished request's ``RequestStats`` from these records (backend/core/request_state.py). The serving layer
turns them into latency histograms, the per-request log line and trace spans (backend/serving/telemetry.py).
Nothing here is conditional on tracing: the cost is a few attribute writes per scheduled sequence per step.

Times are ``time.monotonic()`` seconds (``Sequence.arrival_time`` and ``first_token_time`` too);
the serving layer converts them to wall-clock time for spans.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence as Seq

from backend.core.plan import ModelRunnerOutput, SchedulerOutput
from backend.engine.step_observer import StepObserver

MAX_CHUNK_RECORDS = 64        # prefill chunks kept per sequence (a count is kept beyond)
MAX_PREEMPTION_RECORDS = 16   # preemption times kept per sequence


@dataclass(frozen=True)
class StepMark:
    """What ``mark_scheduled`` noted about one scheduled sequence, for ``mark_step_done``."""

    prefill: bool


def mark_scheduled(plan: SchedulerOutput, now: float) -> list[StepMark]:
    """Before the forward: stamp first scheduling and preemptions; note each sequence's kind of step."""
    for seq in plan.preempted:
        tl = seq.timeline
        if len(tl.preemptions) < MAX_PREEMPTION_RECORDS:
            tl.preemptions.append(now)
    marks = []
    for s in plan.scheduled:
        seq = s.seq
        tl = seq.timeline
        if tl.first_scheduled is None:
            tl.first_scheduled = now
        # a prefill chunk: more than one token left to compute, or the first token not out yet
        marks.append(StepMark(seq.num_tokens - seq.num_computed_tokens > 1 or seq.num_output_tokens == 0))
    return marks


def mark_step_done(plan: SchedulerOutput, marks: Seq[StepMark], sampled: Seq[Seq[int]], started: float,
                   now: float) -> None:
    """After sampling, before ``update_from_output``: record each sequence's last step, prefill chunks, decode
    steps and inter-token latencies. ``sampled``: the runner's tokens per scheduled sequence; tokens the scheduler then drops
    (after a stop) are trimmed in ``request_stats``."""
    for s, mark, tokens in zip(plan.scheduled, marks, sampled):
        tl = s.seq.timeline
        tl.last_step = now
        n_new = len(tokens)
        if mark.prefill:
            tl.num_prefill_chunks += 1
            if len(tl.prefill_chunks) < MAX_CHUNK_RECORDS:
                tl.prefill_chunks.append((started, now, s.num_new_tokens))
        elif n_new:
            tl.num_decode_steps += 1
        if not n_new:
            continue
        if tl.last_token is not None:   # several tokens in one step (speculation): the step's time split evenly
            gap = (now - tl.last_token) / n_new
            tl.inter_token_latencies.extend([gap] * n_new)
        elif n_new > 1:
            tl.inter_token_latencies.extend([0.0] * (n_new - 1))
        tl.last_token = now


class TimelineObserver(StepObserver):
    """Marks each step's sequences: before the forward, and once the tokens are sampled."""

    def __init__(self) -> None:
        self._started = 0.0
        self._marks: list[StepMark] = []

    def before(self, plan: SchedulerOutput) -> None:
        self._started = time.monotonic()
        self._marks = mark_scheduled(plan, self._started)

    def sampled(self, plan: SchedulerOutput, output: ModelRunnerOutput) -> None:
        mark_step_done(plan, self._marks, output.sampled_token_ids, self._started, time.monotonic())
