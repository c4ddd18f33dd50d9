"""Per-request postprocess state, keyed by request id, in a bounded table.

Each request holds its output options and, per sequence (``seq_index`` for ``n > 1``), a
detokenizer and a stop matcher. The processor drops a request when its last sequence finishes;
the table's LRU bound is only a backstop for streams that never finished (e.g. a lost final
response), so a leak cannot grow without limit.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from contracts.output_options import OutputOptions
from postprocess.detokenizer import IncrementalDetokenizer
from postprocess.stop_matcher import StopMatcher

DEFAULT_MAX_REQUESTS = 4096


@dataclass
class SequenceState:
    detokenizer: IncrementalDetokenizer
    stop_matcher: StopMatcher
    prompt_pending: str = ""             # prompt text still to prefix the first delta (exclude_input_in_output=false)
    finished: bool = False               # no more text for the client
    finish_reason: str | None = None
    stopped_by_string: bool = False
    engine_final: bool = False           # the engine sent this sequence's final response
    num_output_tokens: int = 0           # tokens that count as output (up to the one completing a stop)
    guided_ids: list[int] | None = None  # a guided sequence's output tokens, for the check of its finished text


@dataclass
class RequestState:
    options: OutputOptions
    sequences: dict[int, SequenceState] = field(default_factory=dict)
    num_finished: int = 0
    engine_stop_requested: bool = False


@dataclass(frozen=True)
class TableStats:
    live: int
    created: int
    dropped: int
    evicted: int     # removed by the LRU backstop (their final response never came)


class RequestStateTable:
    """An LRU-bounded ``request_id -> RequestState`` map. Not thread-safe: one postprocess instance
    executes one batch at a time, which is what keeps each request's responses in order."""

    def __init__(self, max_requests: int = DEFAULT_MAX_REQUESTS) -> None:
        if max_requests < 1:
            raise ValueError("max_requests: must be >= 1")
        self.max_requests = max_requests
        self._table: OrderedDict[str, RequestState] = OrderedDict()
        self._created = self._dropped = self._evicted = 0

    def __len__(self) -> int:
        return len(self._table)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._table

    def get(self, request_id: str) -> RequestState | None:
        state = self._table.get(request_id)
        if state is not None:
            self._table.move_to_end(request_id)
        return state

    def add(self, request_id: str, state: RequestState) -> RequestState:
        """Insert (or replace) a request's state, evicting the least recently used beyond the bound."""
        self._table[request_id] = state
        self._table.move_to_end(request_id)
        self._created += 1
        while len(self._table) > self.max_requests:
            self._table.popitem(last=False)
            self._evicted += 1
        return state

    def drop(self, request_id: str) -> RequestState | None:
        state = self._table.pop(request_id, None)
        if state is not None:
            self._dropped += 1
        return state

    def stats(self) -> TableStats:
        return TableStats(live=len(self._table), created=self._created, dropped=self._dropped, evicted=self._evicted)
