"""``ModelRunnerOutput``: what one model step returns to the scheduler."""
from __future__ import annotations

from dataclasses import dataclass, field

from .outputs import TokenLogprob


@dataclass
class ModelRunnerOutput:
    """Per ``ScheduledSequence`` of the plan, in plan order.

    ``sampled_token_ids[i]`` is ``[]`` when the plan's ``sample`` was False, one token for a
    plain step, and ``accepted drafts + 1`` tokens when drafts were verified (speculative
    decoding: the accepted draft tokens, then the recovered or bonus token).
    ``logprobs[i]`` has one entry per sampled token when the request asked for logprobs,
    else None. An empty ``logprobs`` list means "no logprobs for anyone".
    """

    sampled_token_ids: list[list[int]]
    logprobs: list[list[TokenLogprob] | None] = field(default_factory=list)
