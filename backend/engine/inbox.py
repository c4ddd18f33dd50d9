"""The engine's inbox: what callers on other threads ask of the loop, as small typed messages.

Callers append under the engine's lock; the loop thread drains the inbox at the start of
every step, so the scheduler is only ever touched by the loop.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from backend.core.outputs import FinishReason, RequestOutput
from contracts.sampling_params import SamplingParams

if TYPE_CHECKING:  # pragma: no cover
    from backend.core.scheduler import Scheduler


@dataclass(frozen=True)
class AddRequest:
    """A request that ``Scheduler.check_request`` already accepted (on the caller's thread)."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float | None = None   # time.monotonic() at add_request (queue time starts there)


@dataclass(frozen=True)
class AbortRequest:
    request_id: str
    steps_done: int | None = None       # the engine's completed steps when the abort arrived (LLMEngine.abort)


InboxMessage = AddRequest | AbortRequest


def queue_full_error(in_engine: int, max_num_seqs: int, max_queued_requests: int) -> str | None:
    """The error for a request arriving while ``in_engine`` requests are in the engine (running, waiting, or
    in the inbox), or None when it may join them. The engine holds up to ``max_num_seqs`` running plus
    ``max_queued_requests`` waiting; beyond that a request is refused at once rather than queued without
    bound. The message names the setting and says to retry (the gateway answers RESOURCE_EXHAUSTED with a
    retry delay, HTTP 429 with Retry-After; Triton has no such status, so a direct client reads the text)."""
    if in_engine < max_num_seqs + max_queued_requests:
        return None
    return (f"max_queued_requests: the engine is full ({in_engine} requests: max_num_seqs {max_num_seqs} "
            f"running + max_queued_requests {max_queued_requests} waiting); unavailable, retry later")


def apply_messages(messages: list[InboxMessage], scheduler: Scheduler,
                   steps_done: int | None = None) -> list[RequestOutput]:
    """The drained messages applied to the scheduler in order; returns the outputs to dispatch (the final
    output of an abort, or an error for a request the scheduler refused at enqueue). ``steps_done``: the
    engine's completed steps now; an abort's final stats then count the steps since it arrived."""
    outs: list[RequestOutput] = []
    for msg in messages:
        if isinstance(msg, AbortRequest):
            outs.extend(_count_steps(scheduler.abort(msg.request_id), msg.steps_done, steps_done))
            continue
        try:
            seqs = scheduler.enqueue(msg.request_id, msg.prompt_token_ids, msg.params)
        except ValueError as e:
            outs.append(RequestOutput(msg.request_id, 0, [], finished=True, request_finished=True,
                                      finish_reason=FinishReason.ERROR, error=str(e)))
            continue
        if msg.arrival_time is not None:
            for seq in seqs:
                seq.arrival_time = msg.arrival_time
    return outs


def _count_steps(outs: list[RequestOutput], at_abort: int | None, now: int | None) -> list[RequestOutput]:
    """``outs`` with ``RequestStats.steps_after_abort`` set on the request's final output (when both counts
    are known): the steps that ended while the abort waited in the inbox."""
    if at_abort is None or now is None:
        return outs
    return [dataclasses.replace(o, stats=dataclasses.replace(o.stats, steps_after_abort=now - at_abort))
            if o.stats is not None else o for o in outs]
