"""The scheduler: one token budget per step, no separate prefill and decode phases (vLLM v1 style).

Each step, every running sequence asks for the tokens it has not computed yet (1 for a
decode, a chunk for an unfinished prefill, ``1 + drafts`` for a speculative verify), oldest
first; then waiting sequences are admitted first-come-first-served while the budget
(``max_num_batched_tokens``), ``max_num_seqs`` and free blocks above the watermark allow.
Long prompts are chunked to the budget left. When a running sequence cannot get blocks,
the most recently admitted running sequence is preempted by recompute: its blocks are
freed, it goes back to the FRONT of the waiting queue, and later re-prefills prompt +
output (often from the prefix cache) and continues exactly where it stopped.

Parallel samples (``n > 1``): sequence 0 is scheduled alone; when its prefill completes
(the step that samples its first token) sequences 1..n-1 fork from it: they share its
blocks by ref count with ``num_computed_tokens = prompt_len - 1``, so their first step
recomputes only the last prompt token (1 token each) to get their own logits, and
copy-on-write gives each a private copy of the shared partial block as it writes.
Admission reserves ``max_num_seqs`` slots for the forks.

Sliding windows (``sliding_window``: the window every layer attends within, or None): after each
update a sequence's blocks wholly before its window go back to the pool
(``BlockManager.free_outside_window``).

Not thread-safe: the engine loop thread owns it.
"""
from __future__ import annotations

import itertools
import numbers
import time
from collections import deque
from typing import Callable, Iterable

from backend.config import EngineConfig
from backend.core.block_manager import BlockManager
from backend.core.outputs import FinishReason, RequestOutput, TokenLogprob
from backend.core.plan import ModelRunnerOutput, ScheduledSequence, SchedulerOutput
from backend.core.request_state import RequestState, run_continues, stop_reason
from backend.core.scheduler_stats import SchedulerStats, SpecDecodeCounters
from backend.core.sequence import Sequence, SequenceStatus
from backend.core.stream_pacer import StreamPacer
from contracts.sampling_params import SamplingParams


class Scheduler:
    def __init__(self, config: EngineConfig, *, num_blocks: int, max_model_len: int, vocab_size: int,
                 eos_token_ids: Iterable[int], cache_key: str = "", sliding_window: int | None = None,
                 can_admit: Callable[[Sequence], bool] | None = None, pacer: StreamPacer | None = None):
        """``can_admit``: whether a waiting sequence may start now (a guided request waits for its grammar, a
        LoRA request for a slot); None admits every one in turn. ``pacer``: the tokens a streamed output may
        hold back (``pacer.current``, fed by the engine each step); by default one from ``stream_interval``
        and ``stream_responses_per_s``."""
        if max_model_len < 2:
            raise ValueError(f"max_model_len: must be >= 2, got {max_model_len}")
        if num_blocks * config.cache.block_size < max_model_len:
            raise ValueError(
                f"num_kv_blocks: {num_blocks} blocks of {config.cache.block_size} tokens cannot hold one sequence of "
                f"max_model_len={max_model_len} tokens; give the KV cache more memory or lower max_model_len")
        if vocab_size < 1:
            raise ValueError(f"vocab_size: must be >= 1, got {vocab_size}")
        self.config = config
        self.sliding_window = sliding_window
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.eos_token_ids = frozenset(eos_token_ids)
        self.block_manager = BlockManager(num_blocks, config.cache.block_size,
                                          enable_prefix_caching=config.cache.enable_prefix_caching, cache_key=cache_key,
                                          kv_cache_dtype=config.cache.kv_cache_dtype)
        self.watermark_blocks = int(config.cache.watermark * num_blocks)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []          # admission order (oldest first)
        self._requests: dict[str, RequestState] = {}
        self._seq_ids = itertools.count()
        self._finished_seq_ids: list[int] = []    # ended since the last plan (the runner drops their state)
        self.spec_counters = SpecDecodeCounters()
        self.pacer = pacer if pacer is not None else StreamPacer(config.scheduler.stream_interval,
                                                                 config.scheduler.stream_responses_per_s)
        self.num_preemptions = 0
        self.num_scheduled_last_step = 0
        self.num_batched_tokens_last_step = 0
        self._can_admit = can_admit

    # ---- requests ---------------------------------------------------------------------------
    def check_request(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Raise ``ValueError`` naming the field when the request cannot be served."""
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params: expected SamplingParams, got {type(params).__name__}")
        n = len(prompt_token_ids)
        if n == 0:
            raise ValueError("prompt_token_ids: the prompt is empty")
        for t in prompt_token_ids:
            if isinstance(t, bool) or not isinstance(t, numbers.Integral) or not 0 <= t < self.vocab_size:
                raise ValueError(f"prompt_token_ids: token id {t!r} is outside the vocabulary [0, {self.vocab_size})")
        params.check_vocab(self.vocab_size)
        if n > self.max_model_len:
            raise ValueError(f"prompt_token_ids: the prompt has {n} tokens, more than max_model_len "
                             f"({self.max_model_len})")
        if n + params.max_tokens > self.max_model_len:
            raise ValueError(f"max_tokens: prompt ({n} tokens) + max_tokens ({params.max_tokens}) exceeds "
                             f"max_model_len ({self.max_model_len})")
        k_engine = self.config.speculative.num_speculative_tokens if self.config.speculative.enabled else 0
        if params.num_speculative_tokens is not None and params.num_speculative_tokens > k_engine:
            raise ValueError(f"num_speculative_tokens: {params.num_speculative_tokens} exceeds the engine's "
                             f"num_speculative_tokens ({k_engine}"
                             f"{'' if self.config.speculative.enabled else ': speculative decoding is off'})")
        if params.n > self.config.scheduler.max_num_seqs:
            raise ValueError(f"n: {params.n} parallel samples exceed max_num_seqs "
                             f"({self.config.scheduler.max_num_seqs})")

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams) -> list[Sequence]:
        """Validate (``check_request``) and queue a request; returns its ``n`` sequences (index order)."""
        if not isinstance(request_id, str) or not request_id:
            raise ValueError("request_id: must be a non-empty string")
        self.check_request(prompt_token_ids, params)
        return self.enqueue(request_id, prompt_token_ids, params)

    def enqueue(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams) -> list[Sequence]:
        """Queue a request that ``check_request`` accepted (the engine checks on the caller's thread)."""
        if request_id in self._requests:
            raise ValueError(f"request_id: {request_id!r} is already in flight")
        prompt = [int(t) for t in prompt_token_ids]
        now = time.monotonic()
        seqs = [Sequence(seq_id=next(self._seq_ids), request_id=request_id, seq_index=i, prompt_token_ids=prompt,
                         params=params, arrival_time=now) for i in range(params.n)]
        self._requests[request_id] = RequestState(request_id, seqs, pending_forks=seqs[1:])
        self.waiting.append(seqs[0])
        return seqs

    def abort(self, request_id: str, reason: FinishReason = FinishReason.ABORT,
              error: str | None = None) -> list[RequestOutput]:
        """End a request now, freeing all its blocks. Returns its final outputs ([] for an unknown id):
        one per unfinished sequence, the last with ``request_finished=True``."""
        req = self._requests.pop(request_id, None)
        if req is None:
            return []
        live = [s for s in req.seqs if not s.is_finished]
        ids = {s.seq_id for s in live}
        self.running = [s for s in self.running if s.seq_id not in ids]
        self.waiting = deque(s for s in self.waiting if s.seq_id not in ids)
        req.pending_forks = []
        outs = []
        for seq in live:
            self.block_manager.free(seq)
            self._finish(req, seq, reason)
            outs.append(req.emit(seq, self.pacer.current, error=error))   # never None: finished
        return outs

    def request_ids(self) -> list[str]:
        return list(self._requests)

    def has_unfinished(self) -> bool:
        return bool(self._requests)

    def update_draft_token_ids(self, drafts: dict[int, list[int]]) -> None:
        """Set the draft tokens (``seq_id -> tokens``) that the next plan verifies; the only way in.

        Drafts of a sequence that is not running, or that still has prompt left to compute, are
        dropped by ``schedule``; each is trimmed there to the budget, the context and max_tokens.
        """
        by_id = {s.seq_id: s for s in self.running}
        for seq_id, tokens in drafts.items():
            seq = by_id.get(seq_id)
            if seq is None:
                continue
            for t in tokens:   # a plain int skips the ABC check (~5 us a step in the engine, cold after the forward)
                if (type(t) is not int and (isinstance(t, bool) or not isinstance(t, numbers.Integral))) \
                        or not 0 <= t < self.vocab_size:
                    raise ValueError(f"draft_token_ids: token id {t!r} is outside the vocabulary "
                                     f"[0, {self.vocab_size})")
            seq.draft_token_ids = [int(t) for t in tokens]

    def stats(self) -> SchedulerStats:
        bm = self.block_manager
        prefilling = sum(1 for s in self.running if s.num_tokens - s.num_computed_tokens > 1)
        return SchedulerStats(len(self.running), len(self.waiting), prefilling, self.num_scheduled_last_step,
                              self.num_batched_tokens_last_step, self.num_preemptions, bm.num_blocks,
                              bm.num_free_blocks, bm.num_used_blocks, bm.num_cached_blocks,
                              bm.prefix_cache_queries, bm.prefix_cache_hits, self.spec_counters.snapshot())

    # ---- one step: plan ---------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        bm, cfg = self.block_manager, self.config
        budget = cfg.scheduler.max_num_batched_tokens
        scheduled: list[ScheduledSequence] = []
        preempted: list[Sequence] = []

        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            num_new, num_drafts = self._num_running_tokens(seq, budget)
            while bm.allocate_slots(seq, num_new) is None:
                victim = self.running.pop()             # the most recently admitted
                self._preempt(victim)
                preempted.append(victim)
                if victim is seq:
                    break
            if seq.status is not SequenceStatus.RUNNING:
                break                                   # it preempted itself: nobody after it is left
            sample = seq.num_computed_tokens + num_new >= seq.num_tokens
            scheduled.append(ScheduledSequence(seq, num_new, sample, num_drafts))
            budget -= num_new
            i += 1

        if not preempted:   # admitting while preempting would thrash
            reserved = sum(len(self._requests[s.request_id].pending_forks) for s in self.running if s.seq_index == 0)
            while self.waiting and budget > 0:
                seq = self._next_admissible()
                if seq is None:
                    break
                forks = len(self._requests[seq.request_id].pending_forks) if seq.seq_index == 0 else 0
                if len(self.running) + reserved + 1 + forks > cfg.scheduler.max_num_seqs:
                    break
                computed = bm.get_computed_blocks(seq)
                num_new = min(seq.num_tokens - computed.num_cached_tokens, budget)
                reserve = self.watermark_blocks if self.running else 0
                if bm.allocate_slots(seq, num_new, computed=computed, reserve=reserve) is None:
                    break                               # FCFS: nobody overtakes the head of the queue
                self.waiting.remove(seq)
                seq.status = SequenceStatus.RUNNING
                seq.num_computed_tokens = seq.num_cached_tokens = computed.num_cached_tokens
                self.running.append(seq)
                reserved += forks
                sample = seq.num_computed_tokens + num_new >= seq.num_tokens
                scheduled.append(ScheduledSequence(seq, num_new, sample))
                budget -= num_new

        num_tokens = cfg.scheduler.max_num_batched_tokens - budget
        self.num_scheduled_last_step, self.num_batched_tokens_last_step = len(scheduled), num_tokens
        finished, self._finished_seq_ids = self._finished_seq_ids, []
        return SchedulerOutput(scheduled, num_tokens, bm.take_blocks_to_copy(), preempted, finished)

    def _next_admissible(self) -> Sequence | None:
        """The first waiting sequence that ``can_admit`` (all of them wait their turn otherwise)."""
        can_admit = self._can_admit
        if can_admit is None:
            return self.waiting[0]
        return next((s for s in self.waiting if can_admit(s)), None)

    def _num_running_tokens(self, seq: Sequence, budget: int) -> tuple[int, int]:
        """(tokens to compute, of which drafts) for a running sequence; trims its drafts to what can pay."""
        remaining = seq.num_tokens - seq.num_computed_tokens          # >= 1 for a running sequence
        if remaining > 1 or not seq.draft_token_ids:
            seq.draft_token_ids = []
            return min(remaining, budget), 0
        p = seq.params
        k = min(len(seq.draft_token_ids), budget - 1, self.max_model_len - seq.num_tokens - 1,
                p.max_tokens - seq.num_output_tokens - 1)
        seq.draft_token_ids = seq.draft_token_ids[:max(k, 0)]
        return 1 + len(seq.draft_token_ids), len(seq.draft_token_ids)

    def _preempt(self, seq: Sequence) -> None:
        self.block_manager.free(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_computed_tokens = 0
        seq.draft_token_ids = []
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    # ---- one step: apply results ------------------------------------------------------------
    def update_from_output(self, plan: SchedulerOutput, output: ModelRunnerOutput) -> list[RequestOutput]:
        """Apply one step's results: each prefill chunk that samples nothing (``_apply_chunk``), each sampled
        sequence's tokens (``_apply_sampled``). Returns the outputs to stream now (``pacer.current``)."""
        if len(output.sampled_token_ids) != len(plan.scheduled):
            raise ValueError(f"runner output has {len(output.sampled_token_ids)} rows for "
                             f"{len(plan.scheduled)} scheduled sequences")
        outs, now, interval = [], time.monotonic(), self.pacer.current
        any_finished = False
        for k, sched in enumerate(plan.scheduled):
            seq = sched.seq
            if seq.status is not SequenceStatus.RUNNING:
                continue                                 # aborted since the plan was made
            tokens = output.sampled_token_ids[k]
            if not sched.sample:
                self._apply_chunk(sched, tokens)
                continue
            req = self._requests[seq.request_id]
            lps = output.logprobs[k] if k < len(output.logprobs) else None
            any_finished |= self._apply_sampled(req, sched, tokens, lps, now)
            out = req.emit(seq, interval)
            if out is not None:
                outs.append(out)
        if any_finished:
            self.running = [s for s in self.running if s.status is SequenceStatus.RUNNING]
        return outs

    def _apply_chunk(self, sched: ScheduledSequence, tokens: list[int]) -> None:
        """A prefill chunk that samples nothing: its tokens are computed; full blocks go to the prefix cache."""
        seq = sched.seq
        if tokens:
            raise ValueError(f"runner sampled for sequence {seq.seq_id}, whose chunk had sample=False")
        seq.num_computed_tokens += sched.num_new_tokens
        self.block_manager.commit_full_blocks(seq)
        if self.sliding_window is not None:
            self.block_manager.free_outside_window(seq, self.sliding_window)

    def _apply_sampled(self, req: RequestState, sched: ScheduledSequence, tokens: list[int],
                       lps: list[TokenLogprob] | None, now: float) -> bool:
        """A sampled sequence's step: drafts settled (the speculation counts), the parallel samples forked after
        the prompt's last chunk, the tokens appended until a stop. Returns whether the sequence finished."""
        seq, bm = sched.seq, self.block_manager
        if not 1 <= len(tokens) <= sched.num_draft_tokens + 1:
            raise ValueError(f"runner returned {len(tokens)} tokens for sequence {seq.seq_id} "
                             f"({sched.num_draft_tokens} drafts)")
        # rejected drafts are not computed: their K/V slots get rewritten later, and blocks that
        # held only rejected positions go back to the pool
        num_rejected = sched.num_draft_tokens + 1 - len(tokens)
        seq.num_computed_tokens += sched.num_new_tokens - num_rejected
        seq.draft_token_ids = []
        if sched.num_draft_tokens:
            seq.num_spec_draft_tokens += sched.num_draft_tokens
            seq.num_spec_accepted_tokens += len(tokens) - 1
            self.spec_counters.record(sched.num_draft_tokens, len(tokens) - 1)
            if num_rejected:
                bm.truncate(seq, seq.num_computed_tokens)
        if req.pending_forks and seq.num_output_tokens == 0:
            bm.commit_full_blocks(seq)
            self._fork(req, seq)
        one_by_one = tokens
        if lps is None and len(tokens) > 1 and run_continues(seq, tokens, self.eos_token_ids, self.max_model_len):
            seq.output_token_ids.extend(tokens)         # an accepted run that cannot stop: at once
            if seq.first_token_time is None:
                seq.first_token_time = now
            one_by_one = ()                             # nothing left to append; the loop's else commits
        for j, token in enumerate(one_by_one):
            seq.output_token_ids.append(token)
            if seq.first_token_time is None:
                seq.first_token_time = now
            if lps is not None and j < len(lps):
                seq.cum_logprob += lps[j].logprob
                req.logprob_buf[seq.seq_index].append(lps[j])
            reason = stop_reason(seq, token, self.eos_token_ids, self.max_model_len)
            if reason is not None:
                bm.commit_full_blocks(seq)
                self._stop(req, seq, reason)
                return True
        bm.commit_full_blocks(seq)
        if self.sliding_window is not None:
            bm.free_outside_window(seq, self.sliding_window)
        return False

    def append_forced_tokens(self, seq: Sequence, tokens: list[int]) -> tuple[int, RequestOutput | None]:
        """Append tokens decided without the model (a grammar's jump-forward) to a running sequence.
        They are not computed: the next plan computes them with the last sampled token in one chunk and
        samples after them. Stops as sampled tokens do (max_tokens, context) and streams as they do (the
        paced interval). Returns (tokens appended, the output to stream now or None)."""
        if seq.status is not SequenceStatus.RUNNING or not tokens:
            return 0, None
        req = self._requests[seq.request_id]
        n = 0
        for token in tokens:
            seq.output_token_ids.append(token)
            n += 1
            reason = stop_reason(seq, token, self.eos_token_ids, self.max_model_len)
            if reason is not None:
                self._stop(req, seq, reason)
                self.running = [s for s in self.running if s.status is SequenceStatus.RUNNING]
                break
        return n, req.emit(seq, self.pacer.current)

    def _stop(self, req: RequestState, seq: Sequence, reason: FinishReason) -> None:
        """A running sequence stops: its blocks go back, and the request is forgotten when it was the last."""
        self.block_manager.free(seq)
        self._finish(req, seq, reason)
        if req.finished:
            del self._requests[req.request_id]

    def _finish(self, req: RequestState, seq: Sequence, reason: FinishReason) -> None:
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        seq.draft_token_ids = []
        req.count_finished()
        self._finished_seq_ids.append(seq.seq_id)

    def _fork(self, req: RequestState, parent: Sequence) -> None:
        for child in req.pending_forks:
            self.block_manager.fork(parent, child)
            child.num_computed_tokens = child.num_tokens - 1   # recompute the last prompt token: own logits
            child.status = SequenceStatus.RUNNING
            self.running.append(child)
        req.pending_forks = []
