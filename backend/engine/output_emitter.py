"""Outputs off the engine loop's critical path: one thread calls the ``on_output`` callbacks.

The loop thread resolves each output's callback (and its bookkeeping) and hands the pairs here; the
emitter calls them in the order received, so each request's outputs keep their order and its final
output stays last. Sending a response (Triton's decoupled sender, telemetry) is Python work of about
a millisecond; the forward of the next step releases the GIL (native ops, MKL), so on a machine with
a second core the two overlap instead of adding up.

When the consumer is behind (its calls take longer than the engine's steps, e.g. a decoupled
send waiting on tritonserver), outputs queue up here. Each batch taken from the queue is first
coalesced (``coalesce``): consecutive streamed outputs of one sequence become one output carrying
all their tokens, so a slow consumer pays its per-call cost once for tokens that are already late,
instead of falling further behind. Nothing is held back for it: only outputs already waiting are
merged, and a sequence's last output is never merged into a later one.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
from collections import deque
from collections.abc import Callable

from backend.core.outputs import RequestOutput

log = logging.getLogger(__name__)


class OutputEmitter:
    def __init__(self, name: str = "llm-engine-output"):
        self._queue: deque[tuple[Callable, object]] = deque()
        self._cv = threading.Condition()
        self._busy = False
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, calls: list[tuple[Callable, object]]) -> None:
        """Queue ``callback(output)`` calls (loop thread); returns at once."""
        if not calls:
            return
        with self._cv:
            self._queue.extend(calls)
            self._cv.notify()

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until every queued call has run; False on timeout (or when called from a callback)."""
        if threading.current_thread() is self._thread:
            return False
        with self._cv:
            return self._cv.wait_for(lambda: not self._queue and not self._busy, timeout=timeout)

    def stop(self, timeout: float = 30.0) -> None:
        """Run what is queued, then end the thread."""
        self.flush(timeout)
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        if threading.current_thread() is not self._thread:   # a callback may shut the engine down
            self._thread.join(timeout=timeout)

    def _run(self) -> None:
        while True:
            with self._cv:
                self._busy = False
                self._cv.notify_all()
                while not self._queue and not self._stopping:
                    self._cv.wait()
                if not self._queue:
                    return
                batch = coalesce(list(self._queue))
                self._queue.clear()
                self._busy = True
            for callback, output in batch:
                try:
                    callback(output)
                except Exception:  # a broken consumer must not take the engine down
                    log.exception("on_output callback failed for %s", getattr(output, "request_id", "?"))


def coalesce(calls: list[tuple[Callable, object]]) -> list[tuple[Callable, object]]:
    """Merge each ``RequestOutput`` into the previous call's output of the same sequence (same callback,
    request and sequence, that output not ``finished``, no output of another of the request's sequences
    between them). The merged output takes the earlier one's place: its tokens go out no later than
    they would have. Other calls pass through in order."""
    out: list[tuple[Callable, object]] = []
    last: dict[tuple[int, str], int] = {}    # (callback, request) -> index in ``out`` of its latest output
    for callback, output in calls:
        if not isinstance(output, RequestOutput):
            out.append((callback, output))
            continue
        key = (id(callback), output.request_id)
        i = last.get(key)
        if i is not None:
            prev = out[i][1]
            if prev.seq_index == output.seq_index and not prev.finished:
                out[i] = (callback, merge_outputs(prev, output))
                continue
        last[key] = len(out)
        out.append((callback, output))
    return out


def merge_outputs(first: RequestOutput, then: RequestOutput) -> RequestOutput:
    """One output for two consecutive outputs of a sequence: ``first``'s tokens (and logprobs) then
    ``then``'s; everything cumulative or final (flags, reason, counts, stats) is ``then``'s."""
    logprobs = None
    if first.logprobs is not None or then.logprobs is not None:
        logprobs = (first.logprobs or []) + (then.logprobs or [])
    return dataclasses.replace(then, new_token_ids=list(first.new_token_ids) + list(then.new_token_ids),
                               logprobs=logprobs)
