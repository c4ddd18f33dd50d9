"""What the engine streams back for each request."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from backend.core.timeline import RequestStats


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
