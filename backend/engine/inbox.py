"""The engine's inbox: what callers on other threads ask of the loop, as small typed messages.

Callers append under the engine's lock; the loop thread drains the inbox at the start of
every step, so the scheduler is only ever touched by the loop.
"""
from __future__ import annotations

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


def apply_messages(messages: list[InboxMessage], scheduler: Scheduler) -> list[RequestOutput]:
    """The drained messages applied to the scheduler in order; returns the outputs to dispatch (the final
    output of an abort, or an error for a request the scheduler refused at enqueue)."""
    outs: list[RequestOutput] = []
    for msg in messages:
        if isinstance(msg, AbortRequest):
            outs.extend(scheduler.abort(msg.request_id))
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
