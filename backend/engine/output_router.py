"""Who receives each engine output: the ``on_output`` callback of every request in flight.

Outputs dispatched on the loop thread go to the loop's output thread (``OutputEmitter``), off the step's
critical path and in order; outputs dispatched elsewhere (``step()`` called directly, shutdown) are
delivered inline. A request's callback is dropped with its ``request_finished`` output, and ``on_finished``
runs for it (the grammar manager drops the request's matchers). Callbacks must not block; one that raises
is logged and never takes the engine down.
"""
from __future__ import annotations

import logging
import threading
from typing import Callable

from backend.core.outputs import RequestOutput
from backend.engine.output_emitter import OutputEmitter

log = logging.getLogger(__name__)
OutputCallback = Callable[[RequestOutput], None]


class OutputRouter:
    def __init__(self, lock: threading.Condition, on_finished: Callable[[str], object] | None = None):
        self.lock = lock                  # the engine's: a request enters this table and the inbox together
        self.callbacks: dict[str, OutputCallback] = {}   # request id -> callback, under lock
        self.on_finished = on_finished
        self.emitter: OutputEmitter | None = None        # the loop's output thread (None: inline callbacks)
        self.loop_thread: threading.Thread | None = None

    def in_flight(self) -> list[str]:
        with self.lock:
            return list(self.callbacks)

    def dispatch(self, outputs: list[RequestOutput]) -> None:
        calls = []
        for out in outputs:
            if out.request_finished and self.on_finished is not None:
                self.on_finished(out.request_id)
            with self.lock:
                cb = self.callbacks.pop(out.request_id, None) if out.request_finished \
                    else self.callbacks.get(out.request_id)
            if cb is not None:
                calls.append((cb, out))
        emitter = self.emitter
        if emitter is not None and threading.current_thread() is self.loop_thread:
            emitter.submit(calls)   # off the loop's critical path, in order
            return
        for cb, out in calls:
            try:
                cb(out)
            except Exception:  # a broken consumer must not take the engine down
                log.exception("on_output callback failed for %s", out.request_id)
