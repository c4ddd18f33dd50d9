"""The engine: a background loop that schedules, runs and streams every request.

Threading: callers (the Triton adapter, tests, benchmarks) only touch the inbox
under a lock; the loop thread alone owns the scheduler, block manager and model.
Once ``start()`` runs the loop, ``on_output`` callbacks run on one output thread
(``OutputEmitter``), in order, overlapped with the next step; without the loop
(``step()`` called directly) they run inline. They must not block. Every request
gets exactly one output with ``request_finished=True``, whatever happens to it.
"""
from __future__ import annotations

import dataclasses
import logging
import random
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from backend.config import EngineConfig
from backend.core.outputs import FinishReason, RequestOutput
from backend.core.scheduler import SpecDecodeCounters
from backend.core.timeline import mark_scheduled, mark_step_done
from backend.engine.builder import EngineParts, build_engine_parts
from backend.engine.inbox import AbortRequest, AddRequest, InboxMessage
from backend.engine.loop_clock import LoopClock, LoopTime
from backend.engine.output_emitter import OutputEmitter
from backend.engine.stream_pacer import StreamPacer
from backend.engine.thread_policy import ThreadPolicy
from backend.sampling.batch import GREEDY_EPS
from contracts.sampling_params import SamplingParams

log = logging.getLogger(__name__)
OutputCallback = Callable[[RequestOutput], None]


@dataclass(frozen=True)
class EngineStats:
    kv_blocks_max: int
    kv_blocks_used: int
    kv_blocks_free: int
    kv_blocks_reused: int          # blocks served from the prefix cache, cumulative
    tokens_per_block: int
    num_running: int
    num_waiting: int
    num_prefilling: int            # running sequences with more than one token left to compute (prompt chunks)
    num_scheduled: int             # sequences in the last step
    num_preemptions: int
    prefix_cache_queries: int      # prompt tokens looked up in the prefix cache, cumulative
    prefix_cache_hits: int         # of which were found
    steps: int
    spec: SpecDecodeCounters = field(default_factory=SpecDecodeCounters)   # speculative decoding, cumulative
    loop: LoopTime | None = None   # the loop thread's step time: CPU, run queue, blocked (None: no loop thread)


class LLMEngine:
    def __init__(self, config: EngineConfig, parts: EngineParts | None = None):
        self.config = config
        self.parts = parts or build_engine_parts(config)
        self.scheduler = self.parts.scheduler
        self.runner = self.parts.runner
        self.speculator = self.parts.speculator   # None unless speculative_method is ngram or draft
        self.pacer = StreamPacer(config.stream_interval, config.stream_responses_per_s)
        self.threads = ThreadPolicy(self.parts.cpu_threads)   # per-step threads on the CPU (1 = fixed)
        self._on_cpu = str(getattr(self.runner, "device", "cpu")).startswith("cpu")   # steps end on this thread
        self.structured = self.parts.structured_output      # None: guided requests are refused
        self._callbacks: dict[str, OutputCallback] = {}
        self._inbox: deque[InboxMessage] = deque()
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._emitter: OutputEmitter | None = None          # the loop's output thread (None: inline callbacks)
        self._loop_clock: LoopClock | None = None           # the loop thread's time (loop_clock.py)
        self._switch: tuple[float, float] | None = None     # (interval set by start(), the one it replaced)
        self._stopping = False
        self._steps = 0
        self._seeds = random.Random(config.seed)   # seeds for unseeded sampled requests (under _cv)
        self._idle = False                                  # the last step had nothing to schedule
        if self.structured is not None:
            self.structured.set_event_callback(self._wake)

    # ---- submission (any thread) -------------------------------------------------
    def add_request(self, request_id: str, prompt_token_ids: Sequence[int], params: SamplingParams,
                    on_output: OutputCallback) -> None:
        """Queue a request; raises ``ValueError`` naming the field when it cannot be served.

        A sampled request (temperature > 0) without a seed gets one drawn here, so that its output
        can be replayed from the seed its final ``RequestOutput.stats`` reports. Greedy requests
        keep ``seed=None`` (they use no randomness)."""
        arrival = time.monotonic()
        if not isinstance(request_id, str) or not request_id:
            raise ValueError("request_id: must be a non-empty string")
        if params.guide is not None and self.structured is None:
            raise ValueError("guided_decoding_guide_type: guided decoding is not available in this engine")
        self.scheduler.check_request(prompt_token_ids, params)   # the one validation; the loop trusts it
        prompt = [int(t) for t in prompt_token_ids]
        with self._cv:
            if self._stopping:
                raise RuntimeError("engine is shut down")
            if request_id in self._callbacks:
                raise ValueError(f"request_id: {request_id!r} is already in flight")
            if params.seed is None and params.temperature >= GREEDY_EPS:
                params = dataclasses.replace(params, seed=self._seeds.getrandbits(63))
            self._callbacks[request_id] = on_output
            if params.guide is not None:
                self.structured.submit(request_id, params.guide)   # compiles off the loop; admitted when ready
            self._inbox.append(AddRequest(request_id, prompt, params, arrival))
            self._cv.notify()

    def abort(self, request_id: str) -> bool:
        """Cancel a request; its blocks are freed on the loop's next turn. False if unknown."""
        with self._cv:
            if request_id not in self._callbacks:
                return False
            self._inbox.append(AbortRequest(request_id))
            self._cv.notify()
            return True

    def stats(self) -> EngineStats:
        s = self.scheduler.stats()
        bs = self.config.block_size
        return EngineStats(
            kv_blocks_max=s.num_kv_blocks, kv_blocks_used=s.num_used_blocks, kv_blocks_free=s.num_free_blocks,
            kv_blocks_reused=s.prefix_cache_hits // bs, tokens_per_block=bs,
            num_running=s.num_running, num_waiting=s.num_waiting, num_prefilling=s.num_prefilling,
            num_scheduled=s.num_scheduled,
            num_preemptions=s.num_preemptions, prefix_cache_queries=s.prefix_cache_queries,
            prefix_cache_hits=s.prefix_cache_hits, steps=self._steps, spec=s.spec,
            loop=self._loop_clock.total() if self._loop_clock is not None else None)

    # ---- the loop (one thread) ---------------------------------------------------
    def start(self) -> "LLMEngine":
        if self._thread is None:
            ms = self.config.python_switch_interval_ms
            if ms > 0:   # process-wide: how long another thread may hold the GIL once the loop asks for it
                before = sys.getswitchinterval()
                sys.setswitchinterval(ms / 1e3)
                self._switch = (sys.getswitchinterval(), before)   # as Python stores it (whole microseconds)
            self._emitter = self._emitter or OutputEmitter()
            self._thread = threading.Thread(target=self._loop, name="llm-engine", daemon=True)
            self._thread.start()
        return self

    def shutdown(self) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        if self._emitter is not None:   # the loop's outputs first, then the final ones below (inline), in order
            self._emitter.stop()
            self._emitter = None
        self._drain_inbox()
        self._finish_all(FinishReason.ABORT, "engine shut down")
        if self.structured is not None:
            self.structured.shutdown()
            self.structured.set_event_callback(None)   # no engine <-> manager cycle left behind
        if self._switch is not None:   # put back what start() replaced, unless someone changed it since
            if sys.getswitchinterval() == self._switch[0]:
                sys.setswitchinterval(self._switch[1])
            self._switch = None

    def loop_alive(self) -> bool:
        """The loop thread is running (False before ``start()``, after ``shutdown()``, or if it died)."""
        t = self._thread
        return t is not None and t.is_alive()

    def has_work(self) -> bool:
        return bool(self._inbox) or self.scheduler.has_unfinished()

    def step(self) -> None:
        """One iteration: take new requests and aborts, schedule, run the forward, sample, apply, stream."""
        step_start, step_cpu = time.perf_counter(), time.thread_time()
        self._drain_inbox()
        if self.speculator is not None:
            self.speculator.release_gone()
        so = self.structured
        if so is not None and so.num_requests:
            self._fail(so.poll())                                       # compile errors and timeouts
        if not self.scheduler.has_unfinished():
            self.pacer.idle()
            return
        plan = self.scheduler.schedule()
        self._idle = not plan.scheduled
        if plan.scheduled:
            threads = self.threads.choose(plan.num_batched_tokens)
            started = time.monotonic()
            marks = mark_scheduled(plan, started)
            spec = self.speculator
            pending = so.begin_fill(plan) if so is not None else None   # grammar bitmask, filled meanwhile
            forward = self.runner.execute(plan)
            bitmask = pending.result(forward.rows) if pending is not None else None
            output = self.runner.sample(plan, forward, grammar_bitmask=bitmask,
                                        draft_probs=spec.draft_probs if spec else None)
            if so is not None:
                self._fail(so.accept(plan, output))                     # advance the matchers
            now = time.perf_counter()
            mark_step_done(plan, marks, output.sampled_token_ids, started, time.monotonic())
            self.scheduler.stream_interval = self.pacer.observe(now, sum(map(len, output.sampled_token_ids)))
            self._dispatch(self.scheduler.update_from_output(plan, output))
            # the whole iteration: a second OpenMP thread that spins after the forward slows the Python around it
            self.threads.observe(plan.num_batched_tokens, threads, time.perf_counter() - step_start)
            if so is not None and self.config.guided_jump_forward:
                self._jump_forward(plan)
            self._steps += 1
            if spec is not None:
                # the speculator's costs: the whole iteration (scheduling and emitting outputs are paid per step,
                # so fewer, longer steps save them too); on one CPU thread the work it did (CPU time), not
                # what other processes took
                one_thread = threads == 1 and self._on_cpu
                spec_clock = time.thread_time if one_thread else time.perf_counter
                spec_seconds = spec_clock() - (step_cpu if one_thread else step_start)
                spec.after_step(self.scheduler, plan, output, spec_seconds, spec_clock)   # drafts for the next step

    def _jump_forward(self, plan) -> None:
        """Append what each guided sequence's grammar forces next (no logprobs for such tokens, so
        requests that asked for logprobs decode token by token)."""
        for s in plan.scheduled:
            seq = s.seq
            if seq.params.guide is None or seq.params.logprobs is not None or not s.sample:
                continue
            room = min(seq.params.max_tokens - seq.num_output_tokens, self.scheduler.max_model_len - seq.num_tokens)
            forced = self.structured.jump_forward(seq, room)
            if forced:
                n, out = self.scheduler.append_forced_tokens(seq, forced)
                self.structured.rollback_forced(seq, len(forced) - n)
                if out is not None:
                    self._dispatch([out])

    def _fail(self, failures: list[tuple[str, str]]) -> None:
        for request_id, error in failures:
            self._dispatch(self.scheduler.abort(request_id, reason=FinishReason.ERROR, error=error))

    def _wake(self) -> None:
        with self._cv:
            self._cv.notify()

    def _wait_while_idle(self) -> None:
        """Nothing was schedulable because every request waits for its grammar: sleep until a compile
        ends, a request or abort arrives, or the earliest compile deadline (never spin, never stall)."""
        if not self._idle or self.structured is None:
            return
        with self._cv:
            wait = self.structured.idle_wait_s()
            if wait is not None and not self._inbox and not self._stopping:
                self._cv.wait(timeout=min(wait + 1e-3, 1.0))

    def _loop(self) -> None:
        torch.set_grad_enabled(False)
        clock = self._loop_clock = LoopClock.for_current_thread()
        while True:
            with self._cv:
                while not self._stopping and not self.has_work():
                    self._cv.wait()
                if self._stopping:
                    clock.total()   # the last reading while this thread lives (stats() after shutdown keep it)
                    return
            t0 = time.perf_counter()
            try:
                self.step()
            except Exception as e:  # a failed step fails its requests, never the loop
                log.exception("engine step failed")
                self._finish_all(FinishReason.ERROR, f"engine error: {type(e).__name__}: {e}")
            clock.add_busy(time.perf_counter() - t0)
            self._wait_while_idle()

    def _drain_inbox(self) -> None:
        with self._cv:
            items = list(self._inbox)
            self._inbox.clear()
        for msg in items:
            if isinstance(msg, AddRequest):
                try:
                    seqs = self.scheduler.enqueue(msg.request_id, msg.prompt_token_ids, msg.params)
                    if msg.arrival_time is not None:
                        for seq in seqs:
                            seq.arrival_time = msg.arrival_time
                except ValueError as e:
                    self._dispatch([RequestOutput(msg.request_id, 0, [], finished=True, request_finished=True,
                                                  finish_reason=FinishReason.ERROR, error=str(e))])
            else:
                self._dispatch(self.scheduler.abort(msg.request_id))

    def _finish_all(self, reason: FinishReason, error: str | None) -> None:
        """End every request the scheduler holds (or that was never admitted) with a final output."""
        outs = []
        for rid in list(self.scheduler.request_ids()):
            outs.extend(self.scheduler.abort(rid, reason=reason, error=error))
        self._dispatch(outs)
        with self._cv:
            leftover = list(self._callbacks)
        self._dispatch([RequestOutput(rid, 0, [], finished=True, request_finished=True, finish_reason=reason,
                                      error=error) for rid in leftover])

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        calls = []
        for out in outputs:
            if out.request_finished and self.structured is not None:
                self.structured.drop(out.request_id)
            with self._cv:
                cb = self._callbacks.pop(out.request_id, None) if out.request_finished \
                    else self._callbacks.get(out.request_id)
            if cb is not None:
                calls.append((cb, out))
        emitter = self._emitter
        if emitter is not None and threading.current_thread() is self._thread:
            emitter.submit(calls)   # off the loop's critical path, in order
            return
        for cb, out in calls:
            try:
                cb(out)
            except Exception:  # a broken consumer must not take the engine down
                log.exception("on_output callback failed for %s", out.request_id)

    # ---- convenience for tests and benchmarks ------------------------------------
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams],
                 timeout: float = 600.0) -> list[list[RequestOutput]]:
        """Submit every prompt, wait for all, return each request's outputs in order."""
        plist = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        results: list[list[RequestOutput]] = [[] for _ in prompts]
        done = threading.Semaphore(0)

        def collect(i):
            def cb(out):
                results[i].append(out)
                if out.request_finished:
                    done.release()
            return cb

        base = f"gen-{id(results)}"
        for i, (p, sp) in enumerate(zip(prompts, plist)):
            self.add_request(f"{base}-{i}", p, sp, collect(i))
        if self._thread is None:
            while self.has_work():
                self.step()
                self._wait_while_idle()
        for _ in prompts:
            if not done.acquire(timeout=timeout):
                raise TimeoutError("generate timed out")
        return results


def output_token_ids(outputs: list[RequestOutput], seq_index: int = 0) -> list[int]:
    """All tokens of one sequence, concatenated from its streamed outputs."""
    return [t for o in outputs if o.seq_index == seq_index for t in o.new_token_ids]
