"""The grammar compiles of guided requests: submitted from any thread, run off the step loop, polled by it.

Compiles run on a bounded pool of daemon threads (``max_workers``), never on the step loop. A
request waits in the scheduler's queue until its grammar is ready (``is_ready`` is the scheduler's
admission check); identical guides in flight share one compile, and the backend's cache serves
repeats at once. A compile cannot be cancelled: one that outlives ``compile_timeout_s`` fails its
request with an error naming ``guided_decoding_guide`` and keeps its worker busy until it ends
(its result is still cached). The time limit counts from submission, so it includes time spent
queued behind other compiles. The backend (the grammar layer) is built on first use, or at model
load by ``warm_up``; when it cannot be built, every guided request fails with the reason.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

from backend.core.sequence import Sequence
from backend.structured_output.daemon_pool import DaemonPool
from backend.structured_output.interface import StructuredOutputBackend
from contracts.sampling_params import GuideSpec

log = logging.getLogger(__name__)
GUIDE = "guided_decoding_guide"
GUIDE_TYPE = "guided_decoding_guide_type"


@dataclass
class _Compile:
    """One guided request's grammar: compiling (``future``) until ``poll`` takes it, or compiled."""

    guide: GuideSpec
    deadline: float
    future: Future | None = None
    compiled: object | None = None


class CompileQueue:
    def __init__(self, backend_factory: Callable[[], StructuredOutputBackend], *, compile_timeout_s: float = 10.0,
                 max_workers: int = 2, clock: Callable[[], float] = time.monotonic):
        self._factory = backend_factory
        self.backend: StructuredOutputBackend | None = None   # built by the first compile or warm_up
        self._backend_error: str | None = None
        self._backend_lock = threading.Lock()
        self.compile_timeout_s = compile_timeout_s
        self._clock = clock
        self._pool = DaemonPool(max_workers, "grammar-compile")
        self._lock = threading.Lock()
        self._requests: dict[str, _Compile] = {}
        self._inflight: dict[tuple[str, str], Future] = {}
        self._compiling: set[str] = set()       # requests whose grammar is not compiled yet (what poll looks at)
        self._news = False                      # a compile ended since the last poll
        self._on_event: Callable[[], None] | None = None
        self.num_compiles = 0                   # compiles started (cache misses, not shared)

    # ---- submission (any thread) --------------------------------------------------------------
    def set_event_callback(self, fn: Callable[[], None] | None) -> None:
        """Called (on a compile thread) when a compile ends, so an idle loop wakes up."""
        self._on_event = fn

    def submit(self, request_id: str, guide: GuideSpec) -> None:
        """Start compiling a request's guide (or take it from the cache)."""
        key = (guide.kind, guide.guide if guide.kind != "json" else "")
        with self._lock:
            entry = _Compile(guide, deadline=self._clock() + self.compile_timeout_s)
            self._requests[request_id] = entry
            backend = self.backend
            hit = backend.cached(*key) if backend is not None else None
            if hit is not None:
                entry.compiled = hit
                return
            fut = self._inflight.get(key)
            if fut is None:
                fut = self._pool.submit(self._compile, *key, on_done=lambda f, key=key: self._compiled(key))
                self._inflight[key] = fut
                self.num_compiles += 1
            entry.future = fut
            self._compiling.add(request_id)

    def drop(self, request_id: str) -> None:
        """Forget a request that ended (any reason); an unfinished compile of it runs on."""
        with self._lock:
            self._requests.pop(request_id, None)
            self._compiling.discard(request_id)

    @property
    def num_requests(self) -> int:
        return len(self._requests)

    # ---- compile threads ------------------------------------------------------------------------
    def get_backend(self) -> StructuredOutputBackend:
        """The grammar layer, built on first use; ``ValueError`` naming the guide type when it cannot be."""
        with self._backend_lock:
            if self.backend is None and self._backend_error is None:
                try:
                    self.backend = self._factory()
                except Exception as e:
                    log.exception("guided decoding backend could not be built")
                    self._backend_error = f"{type(e).__name__}: {e}"
            if self.backend is None:
                raise ValueError(f"{GUIDE_TYPE}: guided decoding is unavailable for this model "
                                 f"({self._backend_error})")
            return self.backend

    def warm_up(self) -> bool:
        """Build the backend now (model load), so the first guided request does not pay for it.
        False when guided decoding is unavailable (requests then fail with the reason)."""
        try:
            self.get_backend()
            return True
        except ValueError:
            return False

    def _compile(self, kind: str, guide: str):
        return self.get_backend().compile(kind, guide)

    def _compiled(self, key) -> None:
        with self._lock:
            self._inflight.pop(key, None)
            self._news = True
        if self._on_event is not None:
            self._on_event()

    # ---- the loop thread ------------------------------------------------------------------------
    def poll(self) -> list[tuple[str, str]]:
        """Take finished compiles; return ``(request_id, error)`` of requests whose compile failed
        or outlived ``compile_timeout_s`` (the caller ends them; they are forgotten here)."""
        if not self._compiling:                  # nothing to look at (a read without the lock: a compile
            return []                            # submitted meanwhile is seen by the next step's poll)
        now = self._clock()
        failures = []
        with self._lock:
            self._news = False
            for rid in list(self._compiling):
                e = self._requests[rid]
                if e.future.done():
                    exc = e.future.exception()
                    if exc is None:
                        e.compiled = e.future.result()
                        self._compiling.discard(rid)
                        continue
                    msg = str(exc) if isinstance(exc, ValueError) else \
                        f"{GUIDE}: compiling the grammar failed ({type(exc).__name__}: {exc})"
                    failures.append((rid, msg))
                elif now >= e.deadline:
                    failures.append((rid, (f"{GUIDE}: compiling the grammar took longer than "
                                           f"guided_compile_timeout_s ({self.compile_timeout_s:g} s)")))
            for rid, _ in failures:
                del self._requests[rid]
                self._compiling.discard(rid)
        return failures

    def compiled(self, request_id: str) -> object | None:
        """The request's compiled grammar once ``poll`` (or the cache) has it; None for unguided or waiting ones."""
        e = self._requests.get(request_id)
        return None if e is None else e.compiled

    def is_ready(self, seq: Sequence) -> bool:
        """The scheduler's admission check: unguided requests, and guided ones whose grammar is compiled."""
        e = self._requests.get(seq.request_id)
        return e is None or e.compiled is not None

    def idle_wait_s(self) -> float | None:
        """How long an idle loop (nothing schedulable) may sleep: until the earliest compile deadline;
        None when no compile is pending or one ended since the last ``poll``."""
        with self._lock:
            if self._news:
                return None
            pending = [e.deadline for e in self._requests.values()
                       if e.compiled is None and e.future is not None]
        if not pending:
            return None
        return max(0.0, min(pending) - self._clock())

    def shutdown(self) -> None:
        self._pool.shutdown()
