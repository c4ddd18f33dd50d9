"""``DaemonPool``: a few daemon worker threads running queued calls (a stuck call must not hold up
interpreter exit); the grammar compiles and the CUDA step's bitmask fill each have their own."""
from __future__ import annotations

import queue
import threading
from concurrent.futures import Future


class DaemonPool:
    """``workers`` daemon threads (a stuck compile must not hold up interpreter exit)."""

    def __init__(self, workers: int, name: str):
        self._q: queue.Queue = queue.Queue()
        self._threads = [threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True)
                         for i in range(workers)]
        for t in self._threads:
            t.start()

    def submit(self, fn, *args, on_done=None) -> Future:
        """Queue ``fn(*args)``. ``on_done(future)`` is attached before the work is queued, so it always
        runs on the worker thread, never in the caller's (which may hold locks the callback takes)."""
        fut: Future = Future()
        if on_done is not None:
            fut.add_done_callback(on_done)
        self._q.put((fut, fn, args))
        return fut

    def _run(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            fut, fn, args = item
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn(*args))
            except BaseException as e:  # noqa: BLE001 (handed to the waiting request)
                fut.set_exception(e)

    def shutdown(self) -> None:
        for _ in self._threads:
            self._q.put(None)
