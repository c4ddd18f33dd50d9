"""The engine's inbox: what callers on other threads ask of the loop, as small typed messages.

Callers append under the engine's lock; the loop thread drains the inbox at the start of
every step, so the scheduler is only ever touched by the loop.
"""
from __future__ import annotations

from dataclasses import dataclass

from contracts.sampling_params import SamplingParams


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
