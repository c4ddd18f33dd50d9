"""The engine's grammar state in the step: a matcher per guided sequence, the step's bitmask rows, the
tokens sampled under them, jump-forward and the draft checks. The compiles are its ``compiles``
(``CompileQueue``, compile_queue.py).

One step, on the loop thread (``LLMEngine.step``):
1. ``compiles.poll()``: compiles that finished, failed or timed out (failures are ended by the engine);
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

import time
from collections.abc import Callable
from functools import partial

import torch

from backend.core.plan import ModelRunnerOutput, SchedulerOutput
from backend.core.sequence import Sequence, SequenceStatus
from backend.structured_output.bitmask import BitmaskBuffer, PendingFill, fill_verified_positions, sampled_rows
from backend.structured_output.compile_queue import GUIDE, CompileQueue
from backend.structured_output.daemon_pool import DaemonPool
from backend.structured_output.draft_runs import DraftSession, RunResult, accept_run, valid_prefix
from backend.structured_output.interface import GrammarMatcher, StructuredOutputBackend


class StructuredOutputManager:
    def __init__(self, backend_factory: Callable[[], StructuredOutputBackend], *, vocab_size: int,
                 compile_timeout_s: float = 10.0, max_workers: int = 2, device: torch.device | str = "cpu",
                 jump_forward: bool = False, fill_on_worker: bool | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.compiles = CompileQueue(backend_factory, compile_timeout_s=compile_timeout_s, max_workers=max_workers,
                                     clock=clock)
        self.vocab_size = vocab_size
        self.jump_forward_on = jump_forward     # the engine appends forced tokens (guided_jump_forward)
        self._filler = DaemonPool(1, "grammar-bitmask")  # its own thread: never queued behind a compile
        self._matchers: dict[str, dict[int, GrammarMatcher]] = {}   # request id -> seq_index -> matcher
        cuda = torch.device(device).type == "cuda"
        self._bitmask = BitmaskBuffer(vocab_size, pin=cuda)
        # the bitmask is filled on a worker thread during the forward, else on the loop thread after it
        self.fill_on_worker = cuda if fill_on_worker is None else fill_on_worker
        self.num_rejected_tokens = 0
        self.num_forced_tokens = 0              # appended by jump-forward (each saves a forward pass)

    @property
    def num_requests(self) -> int:
        """Guided requests in flight (compiling or compiled)."""
        return self.compiles.num_requests

    def drop(self, request_id: str) -> None:
        """Forget a request that ended (any reason): its matchers, and its compile (which runs on if unfinished)."""
        self._matchers.pop(request_id, None)
        self.compiles.drop(request_id)

    def _matcher(self, seq: Sequence) -> GrammarMatcher | None:
        per_seq = self._matchers.get(seq.request_id)
        m = per_seq.get(seq.seq_index) if per_seq is not None else None
        if m is None:       # a new sequence (or a fork of seq 0, which starts with no output either)
            compiled = self.compiles.compiled(seq.request_id)
            if compiled is None:
                return None
            m = self.compiles.backend.matcher(compiled)
            self._matchers.setdefault(seq.request_id, {})[seq.seq_index] = m
        return m

    def begin_fill(self, plan: SchedulerOutput) -> PendingFill:
        """Start the step's bitmask (call before the forward): the fill runs on the worker thread, or is
        deferred to ``PendingFill.result`` after the forward. A step without drafts looks its matchers up
        here, so that only the fill itself (``fill_rows``) is left for after the forward. A step without
        a guided sampled row gets a finished ``PendingFill`` of None at once, without work."""
        if not self.compiles.num_requests:
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
        if not self.compiles.num_requests or not rows:
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
        fill_verified_positions(self.compiles.backend.fill_bitmasks, entries, bitmask)
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
        self.compiles.backend.fill_bitmasks(matchers, bitmask, filled)
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
        if not self.compiles.num_requests:
            return None
        matchers = [self._matcher(s) if s.params.guide is not None else None for s in seqs]
        if all(m is None for m in matchers):
            return None
        return DraftSession(matchers, self.compiles.backend.fill_bitmasks, self._bitmask.words)

    def accept(self, plan: SchedulerOutput, output: ModelRunnerOutput) -> list[tuple[str, str]]:
        """Advance each guided sequence's matcher through its new tokens (``accept_run``; a token it
        drops is removed from ``output``). Returns ``(request_id, error)`` for sequences whose grammar
        rejected a sampled token (the caller ends those requests). A call per matcher: xgrammar's
        batched accept measured no faster, even at 32 sequences."""
        if not self.compiles.num_requests:
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
        self.compiles.shutdown()
        self._filler.shutdown()
