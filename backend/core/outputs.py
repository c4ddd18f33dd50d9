"""What the engine streams back for each request, and what a finished request reports about itself."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field


class FinishReason(str, enum.Enum):
    STOP = "stop"        # EOS or a stop token id (or, in postprocess, a stop string)
    LENGTH = "length"    # max_tokens reached, or the model's context is full
    ABORT = "abort"      # cancelled by the client or a `stop` request
    ERROR = "error"      # the engine failed this request; `error` says why


@dataclass
class TokenLogprob:
    """Logprob of the chosen token, plus the top-n alternatives when asked."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass(frozen=True)
class RequestStats:
    """What a finished request reports, on its ``request_finished`` output (``RequestOutput.stats``).

    Times are ``time.monotonic()`` seconds; ``None`` where the request never got that far (aborted while
    waiting, or before its first token). Token counts and step counts are summed over the
    request's ``n`` sequences; ``inter_token_latencies`` holds every sequence's. Built by
    ``request_stats`` (backend/core/request_state.py) from the sequences' timelines.
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
    last_step_time: float | None = None   # end of the last step that scheduled any of its sequences
    steps_after_abort: int | None = None  # aborted: engine steps that ended between the abort reaching the
                                          # engine and its taking effect (0, or 1: the step in flight); else None

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


@dataclass
class RequestOutput:
    """One increment of one sequence of a request.

    ``new_token_ids`` are the tokens generated since the previous output of the same
    sequence. ``finished`` marks the sequence's last output; ``request_finished`` marks
    the request's very last output (after every one of its ``n`` sequences finished).
    Every request gets exactly one output with ``request_finished=True``; the engine puts the
    request's ``RequestStats`` (timings, counts, the seed it was sampled with) on that one.
    """

    request_id: str
    seq_index: int
    new_token_ids: list[int]
    finished: bool = False
    request_finished: bool = False
    finish_reason: FinishReason | None = None
    error: str | None = None
    logprobs: list[TokenLogprob] | None = None
    cum_logprob: float | None = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_draft_tokens: int = 0            # speculative drafts verified for this sequence so far
    num_accepted_draft_tokens: int = 0   # of which accepted
    stats: RequestStats | None = None
