"""A request in flight in the ``llm`` model, and the record telemetry gets when it finishes."""
from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from backend.core.outputs import RequestOutput
from backend.serving.telemetry import FinishedRequest
from tracing import monotonic_offset


@dataclass
class InFlight:
    engine_id: str
    client_id: str
    request: Any                      # the Triton request (for is_cancelled)
    sender: Any                       # its response sender
    stream: bool
    options: str
    seen_seqs: set = field(default_factory=set)
    # non-stream: seq_index -> (token ids, logprobs, top alternatives, options) held until it ends
    pending: dict = field(default_factory=dict)
    aborted: bool = False
    cancel_checked_at: float = 0.0    # time.monotonic() of the last is_cancelled() call
    # for telemetry (only when it is on)
    params: Any = None                # the request's SamplingParams
    prompt_sha256: str = ""
    num_prompt_tokens: int = 0
    trace_context: str | None = None  # Triton's span context (only when tracing is on)
    stopped_by: str | None = None     # stop_string | cancelled | error (postprocess) | stop_request (client)
    stopped_at: float | None = None   # time.monotonic() of the stop
    output_hashes: dict = field(default_factory=dict)   # seq_index -> sha256 of its output token ids
    finish_reasons: dict = field(default_factory=dict)  # seq_index -> finish reason

    def note_output(self, out: RequestOutput) -> None:
        """Hash the output's tokens into its sequence's digest; keep a finished sequence's reason."""
        h = self.output_hashes.get(out.seq_index)
        if h is None:
            h = self.output_hashes[out.seq_index] = hashlib.sha256()
        if out.new_token_ids:
            h.update(np.asarray(out.new_token_ids, dtype="<i4").tobytes())
        if out.finished and out.finish_reason is not None:
            self.finish_reasons[out.seq_index] = out.finish_reason.value


def prompt_digest(prompt: list[int]) -> str:
    """The sha256 of the prompt's token ids (little-endian int32), as the request log reports it."""
    return hashlib.sha256(np.asarray(prompt, dtype="<i4").tobytes()).hexdigest()


def finished_request(flight: InFlight, out: RequestOutput, model_name: str) -> FinishedRequest:
    """The telemetry record of a request whose last output is ``out``. An abort the engine reports for a
    stop by postprocess is what the client sees instead (a stop string: ``stop``; an error: ``error``)."""
    seen_as = {"stop_string": "stop", "error": "error"}.get(flight.stopped_by or "", "abort")
    reason = out.finish_reason.value if out.finish_reason is not None else "error"
    reason = seen_as if reason == "abort" else reason
    reasons = [flight.finish_reasons.get(i, reason) for i in sorted(flight.output_hashes)]
    reasons = [seen_as if r == "abort" else r for r in reasons]
    return FinishedRequest(
        model_name=model_name, engine_id=flight.engine_id, client_id=flight.client_id,
        params=flight.params, stats=out.stats, finish_reason=reason, finish_reasons=reasons,
        stopped_by=flight.stopped_by, stopped_at=flight.stopped_at, error=out.error,
        prompt_sha256=flight.prompt_sha256,
        num_prompt_tokens=flight.num_prompt_tokens,
        output_sha256=[flight.output_hashes[i].hexdigest() for i in sorted(flight.output_hashes)],
        options=flight.options, trace_context=flight.trace_context, finished_wall=time.time(),
        wall_offset=monotonic_offset())
