"""The engine's per-request grammar state: compiles off the step loop, a matcher per sequence,
the step's bitmask rows, and the tokens sampled under them.

Compiles run on a bounded pool of daemon threads (``max_workers``), never on the step loop. A
request waits in the scheduler's queue until its grammar is ready (``is_ready`` is the scheduler's
admission check); identical guides in flight share one compile, and the backend's cache serves
repeats at once. A compile cannot be cancelled: one that outlives ``compile_timeout_s`` fails its
request with an error naming ``guided_decoding_guide`` and keeps its worker busy until it ends
(its result is still cached). The time limit counts from submission, so it includes time spent
queued behind other compiles.

One step, on the loop thread (``LLMEngine.step``):
1. ``poll()``: compiles that finished, failed or timed out (failures are ended by the engine);
2. ``begin_fill(plan)`` before the forward, ``PendingFill.result()`` after it: the step's bitmask
   (a step without guided rows does no grammar work). On CUDA it is filled on a worker thread while
   the loop thread launches the forward (xgrammar's fill releases the GIL; the forward touches no
   matcher, so the worker owns them until ``result()`` returns). On the CPU it is filled by
   ``result()`` on the loop thread after the forward, eager or native: a fill takes 1-2 µs a row,
   less than handing it to a worker and back (a thread wake-up per step, milliseconds on busy cores;
   docs/engine.md). One row per sampled
   position; a sequence verifying drafts has ``drafts + 1`` consecutive rows, row ``i`` filled after
   advancing its matcher through the first ``i`` drafts, then rolled back (so the state stays at the
   last accepted token);
3. ``accept(plan, output)``: each matcher advances through the tokens its sequence gained (accepted
   drafts, then the recovered or bonus token), stopping where its grammar terminates (EOS inside an
   accepted run: the scheduler drops what follows and finishes the request with ``stop``).
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import partial

import torch

from backend.core.plan import ModelRunnerOutput, SchedulerOutput
from backend.core.sequence import Sequence, SequenceStatus
from backend.structured_output.bitmask import BitmaskBuffer, PendingFill, fill_verified_positions, sampled_rows
from backend.structured_output.draft_runs import DraftSession, RunResult, accept_run, valid_prefix
from backend.structured_output.interface import GrammarMatcher, StructuredOutputBackend
from contracts.sampling_params import GuideSpec

log = logging.getLogger(__name__)
GUIDE = "guided_decoding_guide"
GUIDE_TYPE = "guided_decoding_guide_type"


@dataclass
class _GuidedRequest:
    guide: GuideSpec
    deadline: float
    future: Future | None = None
    compiled: object | None = None
    matchers: dict[int, GrammarMatcher] = field(default_factory=dict)   # seq_index -> matcher


class _DaemonPool:
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


class StructuredOutputManager:
    def __init__(self, backend_factory: Callable[[], StructuredOutputBackend], *, vocab_size: int,
                 compile_timeout_s: float = 10.0, max_workers: int = 2, device: torch.device | str = "cpu",
                 jump_forward: bool = False, fill_on_worker: bool | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self._factory = backend_factory
        self._backend: StructuredOutputBackend | None = None
        self._backend_error: str | None = None
        self._backend_lock = threading.Lock()
        self.vocab_size = vocab_size
        self.compile_timeout_s = compile_timeout_s
        self.jump_forward_on = jump_forward     # the engine appends forced tokens (guided_jump_forward)
        self._clock = clock
        self._pool = _DaemonPool(max_workers, "grammar-compile")
        self._filler = _DaemonPool(1, "grammar-bitmask")  # its own thread: never queued behind a compile
        self._lock = threading.Lock()
        self._requests: dict[str, _GuidedRequest] = {}
        self._inflight: dict[tuple[str, str], Future] = {}
        self._compiling: set[str] = set()       # requests whose grammar is not compiled yet (what poll looks at)
        self._news = False                      # a compile ended since the last poll
        self._on_event: Callable[[], None] | None = None
        cuda = torch.device(device).type == "cuda"
        self._bitmask = BitmaskBuffer(vocab_size, pin=cuda)
        # the bitmask is filled on a worker thread during the forward, else on the loop thread after it
        self.fill_on_worker = cuda if fill_on_worker is None else fill_on_worker
        self.num_compiles = 0                   # compiles started (cache misses, not shared)
        self.num_rejected_tokens = 0
        self.num_forced_tokens = 0              # appended by jump-forward (each saves a forward pass)

    # ---- submission (any thread) --------------------------------------------------------------
    def set_event_callback(self, fn: Callable[[], None]) -> None:
        """Called (on a compile thread) when a compile ends, so an idle loop wakes up."""
        self._on_event = fn

    def submit(self, request_id: str, guide: GuideSpec) -> None:
        """Start compiling a request's guide (or take it from the cache)."""
        key = (guide.kind, guide.guide if guide.kind != "json" else "")
        with self._lock:
            entry = _GuidedRequest(guide, deadline=self._clock() + self.compile_timeout_s)
            self._requests[request_id] = entry
            backend = self._backend
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

    def is_guided(self, request_id: str) -> bool:
        with self._lock:
            return request_id in self._requests

    @property
    def num_requests(self) -> int:
        return len(self._requests)

    # ---- compile threads ------------------------------------------------------------------------
    def _get_backend(self) -> StructuredOutputBackend:
        with self._backend_lock:
            if self._backend is None and self._backend_error is None:
                try:
                    self._backend = self._factory()
                except Exception as e:
                    log.exception("guided decoding backend could not be built")
                    self._backend_error = f"{type(e).__name__}: {e}"
            if self._backend is None:
                raise ValueError(f"{GUIDE_TYPE}: guided decoding is unavailable for this model "
                                 f"({self._backend_error})")
            return self._backend

    def warm_up(self) -> bool:
        """Build the backend now (model load), so the first guided request does not pay for it.
        False when guided decoding is unavailable (requests then fail with the reason)."""
        try:
            self._get_backend()
            return True
        except ValueError:
            return False

    def _compile(self, kind: str, guide: str):
        return self._get_backend().compile(kind, guide)

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

    def _matcher(self, seq: Sequence) -> GrammarMatcher | None:
        e = self._requests.get(seq.request_id)
        if e is None or e.compiled is None:
            return None
        m = e.matchers.get(seq.seq_index)
        if m is None:       # a new sequence (or a fork of seq 0, which starts with no output either)
            m = e.matchers[seq.seq_index] = self._backend.matcher(e.compiled)
        return m

    def begin_fill(self, plan: SchedulerOutput) -> PendingFill:
        """Start the step's bitmask (call before the forward): the fill runs on the worker thread, or is
        deferred to ``PendingFill.result`` after the forward. A step without drafts looks its matchers up
        here, so that only the fill itself (``fill_rows``) is left for after the forward. A step without
        a guided sampled row gets a finished ``PendingFill`` of None at once, without work."""
        if not self._requests:
            return PendingFill(None)
        rows = sampled_rows(plan)
        if len(set(rows)) == len(rows):            # no drafts: a row per sampling sequence
            fill = self._rows_fill(plan, rows)
            if fill is None:
                return PendingFill(None)
        elif any(plan.scheduled[i].seq.params.guide is not None for i in set(rows)):
            fill = partial(self.fill_bitmask, plan, rows)
        else:
            return PendingFill(None)
        if not self.fill_on_worker:
            return PendingFill(rows, deferred=fill)
        return PendingFill(rows, self._filler.submit(fill))

    def fill_bitmask(self, plan: SchedulerOutput, rows: list[int]) -> torch.Tensor | None:
        """The step's grammar bitmask, one row per sampled row (``rows[j]``: the plan index of row j),
        or None when no sampled row is guided. Consecutive rows of one plan index are its verified
        positions: row ``k`` of them is filled after advancing through the first ``k`` drafts."""
        if not self._requests or not rows:
            return None
        if len(set(rows)) == len(rows):
            fill = self._rows_fill(plan, rows)
            return None if fill is None else fill()
        entries = []                               # (matcher, first row, drafts) of each guided sequence
        j = 0
        while j < len(rows):
            i = rows[j]
            n = 1
            while j + n < len(rows) and rows[j + n] == i:
                n += 1
            seq = plan.scheduled[i].seq
            m = self._matcher(seq) if seq.params.guide is not None else None
            if m is not None and not m.is_terminated():
                entries.append((m, j, seq.draft_token_ids[:n - 1]))
            j += n
        if not entries:
            return None
        bitmask = self._bitmask.rows(len(rows))
        fill_verified_positions(self._backend.fill_bitmasks, entries, bitmask)
        return bitmask

    def _rows_fill(self, plan: SchedulerOutput, rows: list[int]) -> Callable[[], torch.Tensor] | None:
        """The fill of a step without drafts (a row per sampling sequence) as a call of ``fill_rows``;
        None when no row is guided (or every guided row's grammar has ended)."""
        matchers, filled = [], []
        for j, i in enumerate(rows):
            seq = plan.scheduled[i].seq
            if seq.params.guide is not None:
                m = self._matcher(seq)
                if m is not None and not m.is_terminated():
                    matchers.append(m)
                    filled.append(j)
        return partial(self.fill_rows, matchers, filled, len(rows)) if matchers else None

    def fill_rows(self, matchers: list[GrammarMatcher], filled: list[int], num_rows: int) -> torch.Tensor:
        """``[num_rows, words]`` bitmask: row ``filled[k]`` what ``matchers[k]`` admits, in one batched fill;
        the buffer is reset to all ones only when some row is not filled."""
        bitmask = self._bitmask.rows(num_rows, reset=len(filled) < num_rows)
        self._backend.fill_bitmasks(matchers, bitmask, filled)
        return bitmask

    def _jumps(self, seq: Sequence) -> bool:
        """Whether the engine jump-forwards this sequence (as ``LLMEngine._jump_forward`` decides)."""
        return self.jump_forward_on and seq.params.guide is not None and seq.params.logprobs is None

    def valid_draft_prefix(self, seq: Sequence, drafts: list[int]) -> int:
        """How many leading draft tokens to verify (the speculator cuts a proposal there): those the
        sequence's grammar admits, ending where it forces what follows when the engine jump-forwards."""
        m = self._matcher(seq) if seq.params.guide is not None else None
        return len(drafts) if m is None else valid_prefix(m, drafts, stop_where_forced=self._jumps(seq))

    def draft_session(self, seqs: list[Sequence]) -> DraftSession | None:
        """Masks for a draft model drafting for ``seqs`` (None when none is guided); close it after."""
        if not self._requests:
            return None
        matchers = [self._matcher(s) if s.params.guide is not None else None for s in seqs]
        if all(m is None for m in matchers):
            return None
        return DraftSession(matchers, self._backend.fill_bitmasks, self._bitmask.words)

    def accept(self, plan: SchedulerOutput, output: ModelRunnerOutput) -> list[tuple[str, str]]:
        """Advance each guided sequence's matcher through its new tokens (``accept_run``; a token it
        drops is removed from ``output``). Returns ``(request_id, error)`` for sequences whose grammar
        rejected a sampled token (the caller ends those requests). A call per matcher: xgrammar's
        batched accept measured no faster, even at 32 sequences."""
        if not self._requests:
            return []
        failures = []
        for s, tokens in zip(plan.scheduled, output.sampled_token_ids):
            seq = s.seq
            if not tokens or seq.params.guide is None or seq.status is not SequenceStatus.RUNNING:
                continue
            m = self._matcher(seq)
            if m is None or (not s.num_draft_tokens and m.accept_tokens(tokens)):   # the common case: done
                continue
            result = accept_run(m, tokens, drop_where_forced=bool(s.num_draft_tokens) and self._jumps(seq))
            if result is RunResult.LAST_DROPPED:
                del tokens[-1]            # the engine appends the forced tokens there instead
            elif result is RunResult.REJECTED:
                self.num_rejected_tokens += 1
                failures.append((seq.request_id, (f"{GUIDE}: the grammar rejected sampled token(s) {tokens} "
                                                  "(bad_words may ban every token it admits)")))
        return failures

    def jump_forward(self, seq: Sequence, limit: int) -> list[int]:
        """The tokens the sequence's grammar forces next (at most ``limit``), already accepted by its
        matcher; [] for unguided or finished sequences. The caller appends them (``rollback_forced``
        takes back any it could not append)."""
        if seq.params.guide is None or seq.status is not SequenceStatus.RUNNING or limit <= 0:
            return []
        m = self._matcher(seq)
        if m is None or m.is_terminated():
            return []
        tokens = m.jump_forward_tokens()[:limit]
        if tokens and not m.accept_tokens(tokens):
            return []
        self.num_forced_tokens += len(tokens)
        return tokens

    def rollback_forced(self, seq: Sequence, num_tokens: int) -> None:
        m = self._matcher(seq)
        if m is not None and num_tokens:
            m.rollback(num_tokens)

    def shutdown(self) -> None:
        self._pool.shutdown()
        self._filler.shutdown()

