"""Jump-forward decoding: after a step, the tokens each guided sequence's grammar forces are appended
without the model (the next plan computes them with the last sampled token in one chunk)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from backend.core.outputs import RequestOutput
from backend.core.plan import SchedulerOutput

if TYPE_CHECKING:  # pragma: no cover
    from backend.core.scheduler import Scheduler
    from backend.structured_output.manager import StructuredOutputManager


def jump_forward(plan: SchedulerOutput, scheduler: Scheduler,
                 structured: StructuredOutputManager) -> list[RequestOutput]:
    """Append what the grammar forces next to each guided sequence that sampled in ``plan``; returns the
    outputs to stream. Requests that asked for logprobs are skipped (forced tokens have none), so they
    decode token by token."""
    outs = []
    for s in plan.scheduled:
        seq = s.seq
        if seq.params.guide is None or seq.params.logprobs is not None or not s.sample:
            continue
        room = min(seq.params.max_tokens - seq.num_output_tokens, scheduler.max_model_len - seq.num_tokens)
        forced = structured.jump_forward(seq, room)
        if forced:
            n, out = scheduler.append_forced_tokens(seq, forced)
            structured.rollback_forced(seq, len(forced) - n)
            if out is not None:
                outs.append(out)
    return outs
