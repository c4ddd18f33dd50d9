"""When things happened to a sequence, and what a finished request reports about itself.

The engine records, around each step, a few timestamps per scheduled sequence (``mark_scheduled``
before the forward, ``mark_step_done`` after sampling); ``RequestState.emit`` stamps
a sequence's end and, on a request's last output, attaches ``RequestStats`` built by
``request_stats``. The serving layer turns those into latency histograms, the per-request log line
and trace spans (backend/serving/telemetry.py). Nothing here is conditional on tracing: the cost is
a few attribute writes per scheduled sequence per step.

Times are ``time.monotonic()`` seconds (``Sequence.arrival_time`` and ``first_token_time`` too);
the serving layer converts them to wall-clock time for spans.
"""
from __future__ import annotations

import time
from array import array
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from typing import Sequence as Seq

if TYPE_CHECKING:  # pragma: no cover
    from backend.core.plan import SchedulerOutput
    from backend.core.sequence import Sequence

MAX_CHUNK_RECORDS = 64        # prefill chunks kept per sequence (a count is kept beyond)
MAX_PREEMPTION_RECORDS = 16   # preemption times kept per sequence


@dataclass(eq=False)
class SequenceTimeline:
    """Per-sequence record, written by the engine loop only (see ``Sequence``)."""

    first_scheduled: float | None = None   # first step that computed any of its tokens
    last_token: float | None = None        # end of the step that produced its latest token
    finished: float | None = None          # when the sequence ended (stamped by RequestState.emit)
    num_decode_steps: int = 0              # steps that computed one token (+ drafts) after the first token
    num_prefill_chunks: int = 0            # steps that computed prompt (or recomputed) tokens
    prefill_chunks: list[tuple[float, float, int]] = field(default_factory=list)  # (start, end, tokens), bounded
    preemptions: list[float] = field(default_factory=list)                        # times, bounded
    inter_token_latencies: array = field(default_factory=lambda: array("d"))      # seconds, one per token after the first


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
    """After sampling, before ``update_from_output`` (so a request finishing in this step reports it):
    record prefill chunks, decode steps and inter-token latencies. ``sampled``: the runner's tokens per
    scheduled sequence; tokens the scheduler then drops (after a stop) are trimmed in ``request_stats``."""
    for s, mark, tokens in zip(plan.scheduled, marks, sampled):
        tl = s.seq.timeline
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


def mark_finished(seq: Sequence) -> None:
    """Stamp the sequence's end once (called for every finished sequence as its last output is built)."""
    if seq.timeline.finished is None:
        seq.timeline.finished = time.monotonic()


@dataclass(frozen=True)
class RequestStats:
    """What a finished request reports, on its ``request_finished`` output (``RequestOutput.stats``).

    Times are monotonic seconds; ``None`` where the request never got that far (aborted while
    waiting, or before its first token). Token counts and step counts are summed over the
    request's ``n`` sequences; ``inter_token_latencies`` holds every sequence's.
    """

    arrival_time: float
    first_scheduled_time: float | None
    first_token_time: float | None
    finished_time: float
    num_prompt_tokens: int
    num_cached_tokens: int            # prompt tokens served from the prefix cache (sequence 0, at admission)
    num_output_tokens: int
    num_decode_steps: int
    num_prefill_chunks: int
    num_preemptions: int
    seed: int | None                  # the seed the request was sampled with (drawn by the engine when unseeded)
    prefill_chunks: tuple[tuple[float, float, int], ...] = ()
    preemption_times: tuple[float, ...] = ()
    inter_token_latencies: tuple[float, ...] = ()
    decode_times: tuple[tuple[float, int], ...] = ()   # per sequence: (decode seconds, output tokens)

    @property
    def queue_time(self) -> float | None:
        return None if self.first_scheduled_time is None else self.first_scheduled_time - self.arrival_time

    @property
    def time_to_first_token(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def e2e_latency(self) -> float:
        return self.finished_time - self.arrival_time

    @property
    def time_per_output_token(self) -> float | None:
        """Mean inter-token time (decode time / (tokens - 1)) over the sequences with >= 2 tokens."""
        per_seq = [t / (n - 1) for t, n in self.decode_times if n >= 2]
        return sum(per_seq) / len(per_seq) if per_seq else None


def request_stats(seqs: Seq[Sequence]) -> RequestStats:
    """Aggregate a finished request's sequences (index order, ``seqs[0]`` first)."""
    first = seqs[0]
    now = time.monotonic()

    def earliest(values):
        values = [v for v in values if v is not None]
        return min(values) if values else None

    itl: list[float] = []
    chunks: list[tuple[float, float, int]] = []
    preemptions: list[float] = []
    decode_times = []
    for s in seqs:
        tl = s.timeline
        itl.extend(tl.inter_token_latencies[:max(0, s.num_output_tokens - 1)])
        chunks.extend(tl.prefill_chunks)
        preemptions.extend(tl.preemptions)
        if s.first_token_time is not None:
            end = tl.last_token if tl.last_token is not None else (tl.finished or now)
            decode_times.append((max(0.0, end - s.first_token_time), s.num_output_tokens))
    return RequestStats(
        arrival_time=first.arrival_time,
        first_scheduled_time=earliest(s.timeline.first_scheduled for s in seqs),
        first_token_time=earliest(s.first_token_time for s in seqs),
        finished_time=max((s.timeline.finished or now) for s in seqs),
        num_prompt_tokens=first.num_prompt_tokens,
        num_cached_tokens=first.num_cached_tokens,
        num_output_tokens=sum(s.num_output_tokens for s in seqs),
        num_decode_steps=sum(s.timeline.num_decode_steps for s in seqs),
        num_prefill_chunks=sum(s.timeline.num_prefill_chunks for s in seqs),
        num_preemptions=sum(s.num_preemptions for s in seqs),
        seed=first.params.seed,
        prefill_chunks=tuple(sorted(chunks)),
        preemption_times=tuple(sorted(preemptions)),
        inter_token_latencies=tuple(itl),
        decode_times=tuple(decode_times),
    )
