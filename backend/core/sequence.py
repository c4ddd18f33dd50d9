"""A sequence: one stream of tokens the engine generates (a request has ``n`` of them).

Terms used across the engine:
- *computed* tokens have their K/V written in the cache (``num_computed_tokens``);
- the sequence's *tokens* are prompt + output; a step schedules tokens that are not yet computed;
- *draft* tokens (speculative decoding) are proposed but not yet verified; they are not in ``output_token_ids``.

One writer per piece of state:
- identity (``seq_id`` .. ``params``, ``arrival_time``): set once when the scheduler creates it;
- progress (``status``, ``num_computed_tokens``, ``num_cached_tokens``, ``output_token_ids``,
  ``draft_token_ids``, ``finish_reason``, ``first_token_time``, ``num_preemptions``,
  ``cum_logprob``, the speculative counts): written only by ``backend/core/scheduler.py`` (drafts enter through
  ``Scheduler.update_draft_token_ids``);
- ``block_table``: written only by ``backend/core/block_manager.py``;
- ``timeline`` (step timestamps for metrics, logs and traces): written only by the engine loop
  (``backend/engine/step_timeline.py``), stamped ``finished`` by ``RequestState.emit``.
Everyone else (runner, sampler, request state, metrics) only reads. Per-sequence sampler state
(a seeded request's RNG) lives in the sampler, keyed by ``seq_id``.
"""
from __future__ import annotations

import enum
import time
from array import array
from dataclasses import dataclass, field

from backend.core.outputs import FinishReason
from contracts.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"      # not admitted, or preempted and requeued (its KV was freed)
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class SequenceTimeline:
    """When things happened to a sequence (``time.monotonic()`` seconds), for metrics, logs and traces."""

    first_scheduled: float | None = None   # first step that computed any of its tokens
    last_token: float | None = None        # end of the step that produced its latest token
    last_step: float | None = None         # end of the latest step that scheduled it (a token or not)
    finished: float | None = None          # when the sequence ended (stamped by RequestState.emit)
    num_decode_steps: int = 0              # steps that computed one token (+ drafts) after the first token
    num_prefill_chunks: int = 0            # steps that computed prompt (or recomputed) tokens
    prefill_chunks: list[tuple[float, float, int]] = field(default_factory=list)  # (start, end, tokens), bounded
    preemptions: list[float] = field(default_factory=list)                        # times, bounded
    inter_token_latencies: array = field(default_factory=lambda: array("d"))      # seconds, one per token after the first


@dataclass(eq=False)
class Sequence:
    seq_id: int
    request_id: str
    seq_index: int                       # 0..n-1 within its request
    prompt_token_ids: list[int]
    params: SamplingParams
    output_token_ids: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0
    block_table: list[int] = field(default_factory=list)   # physical block ids, in order
    num_cached_tokens: int = 0           # prompt tokens served from the prefix cache at admission
    draft_token_ids: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    arrival_time: float = field(default_factory=time.monotonic)
    first_token_time: float | None = None
    num_preemptions: int = 0
    num_spec_draft_tokens: int = 0       # drafts verified for this sequence (speculative decoding)
    num_spec_accepted_tokens: int = 0    # of which accepted
    cum_logprob: float = 0.0
    timeline: SequenceTimeline = field(default_factory=SequenceTimeline)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def token_ids_between(self, start: int, end: int) -> list[int]:
        """Tokens ``start .. end - 1`` of prompt + output, continued by the drafts (a verify step's tail)."""
        n_prompt, n_known = len(self.prompt_token_ids), self.num_tokens
        if end > n_known:      # the known part, then the drafts (a verify step's tail)
            return self.token_ids_between(start, n_known) + self.draft_token_ids[max(0, start - n_known):end - n_known]
        if start >= n_prompt:
            return self.output_token_ids[start - n_prompt:end - n_prompt]
        if end <= n_prompt:
            return self.prompt_token_ids[start:end]
        return self.all_token_ids[start:end]

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED
