"""The contract of one engine step: the scheduler's plan, the forward's logits, the runner's result.

A step (``LLMEngine.step``), as vLLM v1's:
1. ``Scheduler.schedule()`` -> ``SchedulerOutput`` (which tokens of which sequences to compute);
2. ``ModelRunner.execute(plan)`` -> ``ForwardOutput`` (the logits of the rows to sample);
3. a per-step token bitmask may be filled here, while the forward runs (constrained decoding);
4. ``ModelRunner.sample(plan, forward, bitmask)`` -> ``ModelRunnerOutput`` (sampled tokens);
5. ``Scheduler.update_from_output(plan, output)`` -> the ``RequestOutput``s to stream.

Terms for speculative decoding, defined once: a sequence's *draft* tokens are proposed after its
last known token; verification samples one row per draft position plus one. The leading draft
tokens equal to what the target samples are *accepted*; the first target token that differs
from its draft is the *recovered* token (it replaces the rejected draft); when every draft is
accepted the target's token after the last draft is the *bonus* token. So a verified sequence
gains ``accepted + 1`` tokens.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from backend.core.outputs import TokenLogprob
from backend.core.sequence import Sequence


@dataclass
class ScheduledSequence:
    seq: Sequence
    num_new_tokens: int   # compute tokens [seq.num_computed_tokens, +num_new_tokens) of seq.all_token_ids + drafts
    sample: bool          # True when this chunk reaches the last known token, so a token is sampled after it
    num_draft_tokens: int = 0   # trailing tokens that are seq.draft_token_ids (all of them), to verify


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSequence]     # running first (oldest first), then newly admitted
    num_batched_tokens: int                # sum of num_new_tokens  <= max_num_batched_tokens
    blocks_to_copy: list[tuple[int, int]]  # copy-on-write (src_block, dst_block), done by the runner before the forward
    preempted: list[Sequence]              # sequences preempted (by recompute) in this schedule
    finished_seq_ids: list[int] = field(default_factory=list)  # ended since the last plan: the runner drops their state


@dataclass
class ForwardOutput:
    """The forward's result for the rows to sample, in plan order: the last new token of every
    sequence whose chunk reaches its end (``ScheduledSequence.sample``); a sequence verifying ``k``
    drafts has ``k + 1`` consecutive rows (its last known token, then each draft)."""

    logits: torch.Tensor | None   # [num_rows, vocab] fp32; None when no row samples
    rows: list[int]               # plan index of each logits row


@dataclass
class ModelRunnerOutput:
    """Per ``ScheduledSequence`` of the plan, in plan order.

    ``sampled_token_ids[i]`` is ``[]`` when the plan's ``sample`` was False, one token for a
    plain step, and ``accepted drafts + 1`` tokens when drafts were verified (the accepted draft
    tokens, then the recovered or bonus token). ``logprobs[i]`` has one entry per sampled token
    when the request asked for logprobs, else None. An empty ``logprobs`` list means "no
    logprobs for anyone".
    """

    sampled_token_ids: list[list[int]]
    logprobs: list[list[TokenLogprob] | None] = field(default_factory=list)
