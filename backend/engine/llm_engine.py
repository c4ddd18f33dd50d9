"""The engine: a background loop that schedules, runs and streams every request.

Threading: callers (the Triton adapter, tests, benchmarks) only touch the inbox
under a lock; the loop thread alone owns the scheduler, block manager and model.
Once ``start()`` runs the loop, ``on_output`` callbacks run on one output thread
(``OutputEmitter``), in order, overlapped with the next step; without the loop
(``step()`` called directly) they run inline (backend/engine/output_router.py). They must not
block. Every request gets exactly one output with ``request_finished=True``, whatever happens to it.
A step reads as vLLM v1's (docs/engine-design.md); what times and tunes it (threads, stream pacing,
timelines, the speculator's step clock) attaches as ``StepObserver``s (backend/engine/step_observer.py).
"""
from __future__ import annotations

import dataclasses
import logging
import random
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Sequence

import torch

from backend.config import EngineConfig
from backend.core.outputs import FinishReason, RequestOutput
from backend.core.plan import ForwardOutput, ModelRunnerOutput, SchedulerOutput
from backend.engine.builder import EngineParts, build_engine_parts
from backend.engine.generate import generate, output_token_ids
from backend.engine.inbox import AbortRequest, AddRequest, InboxMessage, apply_messages
from backend.engine.jump_forward import jump_forward
from backend.engine.loop_clock import LoopClock
from backend.engine.output_emitter import OutputEmitter
from backend.engine.output_router import OutputCallback, OutputRouter
from backend.engine.pacer_observer import PacerObserver
from backend.engine.spec_step_clock import SpeculatorObserver
from backend.engine.stats import EngineStats, engine_stats
from backend.engine.step_observer import StepObservers, StepStart
from backend.engine.step_timeline import TimelineObserver
from backend.engine.switch_interval import SwitchInterval
from backend.engine.thread_policy import ThreadObserver, ThreadPolicy, matrix_elements
from backend.sampling.batch import GREEDY_EPS
from contracts.sampling_params import SamplingParams

if TYPE_CHECKING:  # pragma: no cover
    from backend.core.scheduler import Scheduler
    from backend.core.stream_pacer import StreamPacer
    from backend.engine.model_runner import ModelRunner
    from backend.spec_decode.speculator import Speculator

log = logging.getLogger(__name__)
__all__ = ["EngineStats", "LLMEngine", "output_token_ids"]


def step_observers(threads: ThreadPolicy, pacer: StreamPacer, speculator: Speculator | None, scheduler: Scheduler,
                   runner: ModelRunner) -> StepObservers:
    """The step's instrumentation, in hook order: threads are set before the timeline's first stamp, and
    the thread policy's report precedes the speculator's (whose seconds include everything before it)."""
    thread_observer = ThreadObserver(threads)
    observers = [thread_observer, TimelineObserver(), PacerObserver(pacer)]
    if speculator is not None:
        on_cpu = str(getattr(runner, "device", "cpu")).startswith("cpu")   # steps end on this thread
        observers.append(SpeculatorObserver(speculator, scheduler, thread_observer, on_cpu))
    return StepObservers(observers)


class LLMEngine:
    def __init__(self, config: EngineConfig, parts: EngineParts | None = None):
        self.config = config
        self.parts = parts or build_engine_parts(config)
        self.scheduler = self.parts.scheduler
        self.runner = self.parts.runner
        self.speculator = self.parts.speculator   # None unless speculative_method is ngram or draft
        self.structured = self.parts.structured_output      # None: guided requests are refused
        self.lora = self.parts.lora                          # None: requests naming an adapter are refused
        self.pacer = self.scheduler.pacer                     # the stream interval, fed each step
        self.threads = ThreadPolicy(self.parts.cpu_threads, macs_per_token=matrix_elements(self.runner.model))
        self.observers = step_observers(self.threads, self.pacer, self.speculator, self.scheduler, self.runner)
        self._inbox: deque[InboxMessage] = deque()
        self._cv = threading.Condition()
        self.outputs = OutputRouter(self._cv, self.structured.drop if self.structured is not None else None)
        self._thread: threading.Thread | None = None
        self._loop_clock: LoopClock | None = None           # the loop thread's time (loop_clock.py)
        self._switch = SwitchInterval(config.execution.python_switch_interval_ms)
        self._stopping = False
        self._steps = 0
        self._seeds = random.Random(config.model.seed)   # seeds for unseeded sampled requests (under _cv)
        self._idle = False                                  # the last step had nothing to schedule
        if self.structured is not None:
            self.structured.compiles.set_event_callback(self._wake)

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
        if params.lora_name is not None:
            if self.lora is None:
                raise ValueError(f"lora_name: {params.lora_name!r}: this engine serves no LoRA adapters")
            self.lora.check(params)
        self.scheduler.check_request(prompt_token_ids, params)   # the one validation; the loop trusts it
        prompt = [int(t) for t in prompt_token_ids]
        with self._cv:
            if self._stopping:
                raise RuntimeError("engine is shut down")
            if request_id in self.outputs.callbacks:
                raise ValueError(f"request_id: {request_id!r} is already in flight")
            if params.seed is None and params.temperature >= GREEDY_EPS:
                params = dataclasses.replace(params, seed=self._seeds.getrandbits(63))
            if params.lora_name is not None:
                on_output = self.lora.hold(params.lora_name, on_output)   # a TensorRT-LLM task stays cached
            self.outputs.callbacks[request_id] = on_output
            if params.guide is not None:
                self.structured.compiles.submit(request_id, params.guide)   # compiles off the loop; admitted when ready
            self._inbox.append(AddRequest(request_id, prompt, params, arrival))
            self._cv.notify()

    def abort(self, request_id: str) -> bool:
        """Cancel a request; its blocks are freed on the loop's next turn. False if unknown."""
        with self._cv:
            if request_id not in self.outputs.callbacks:
                return False
            self._inbox.append(AbortRequest(request_id, self._steps))   # the loop alone writes _steps
            self._cv.notify()
            return True

    def stats(self) -> EngineStats:
        loop = self._loop_clock.total() if self._loop_clock is not None else None
        return engine_stats(self.scheduler.stats(), self.config.cache.block_size, self._steps, loop)

    # ---- the loop (one thread) ---------------------------------------------------
    def start(self) -> "LLMEngine":
        if self._thread is None:
            self._switch.apply()
            self.outputs.emitter = self.outputs.emitter or OutputEmitter()
            self._thread = self.outputs.loop_thread = threading.Thread(target=self._loop, name="llm-engine",
                                                                       daemon=True)
            self._thread.start()
        return self

    def shutdown(self) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        if self.outputs.emitter is not None:   # the loop's outputs first, then the final ones below (inline)
            self.outputs.emitter.stop()
            self.outputs.emitter = None
        self._drain_inbox()
        self._finish_all(FinishReason.ABORT, "engine shut down")
        if self.structured is not None:
            self.structured.shutdown()
            self.structured.compiles.set_event_callback(None)   # no engine <-> manager cycle left behind
        self._switch.restore()

    def loop_alive(self) -> bool:
        """The loop thread is running (False before ``start()``, after ``shutdown()``, or if it died)."""
        t = self._thread
        return t is not None and t.is_alive()

    def has_work(self) -> bool:
        return bool(self._inbox) or self.scheduler.has_unfinished()

    def step(self) -> None:
        """One iteration (docs/engine-design.md, "One step"): admit, schedule, run the forward while the
        grammar bitmask fills, sample, apply and stream; the observers time and tune it."""
        start = StepStart.now()
        self._admit()
        plan = self._schedule()
        if plan is None:
            return
        self.observers.before(plan)                           # the step's threads, timeline stamps
        pending = self.structured.begin_fill(plan) if self.structured is not None else None
        forward = self.runner.execute(plan)
        output = self._sample(plan, forward, pending)
        self.observers.sampled(plan, output)                  # timeline, stream interval
        self.outputs.dispatch(self.scheduler.update_from_output(plan, output))
        if self.structured is not None and self.config.structured_output.guided_jump_forward:
            self.outputs.dispatch(jump_forward(plan, self.scheduler, self.structured))
        self._steps += 1
        self.observers.after(plan, output, start)             # thread policy, speculator (the next drafts)

    def _admit(self) -> None:
        """Take new requests and aborts, free the speculator's state of sequences gone, and fail the
        requests whose grammar did not compile (errors, timeouts)."""
        self._drain_inbox()
        if self.speculator is not None:
            self.speculator.release_gone()
        so = self.structured
        if so is not None and so.num_requests:
            self._fail(so.compiles.poll())

    def _schedule(self) -> SchedulerOutput | None:
        """The step's plan, or None when nothing runs: no request left (the observers go idle), or every
        request waits for its grammar (the loop then sleeps: ``_wait_while_idle``)."""
        if not self.scheduler.has_unfinished():
            self.observers.idle()
            return None
        if self.lora is not None:
            self.lora.admission.begin_step()                   # adapters waiting for a slot: one step more
        plan = self.scheduler.schedule()
        self._idle = not plan.scheduled
        return None if self._idle else plan

    def _sample(self, plan: SchedulerOutput, forward: ForwardOutput, pending) -> ModelRunnerOutput:
        """Sample under the grammar bitmask (``pending``, filled during the forward) and, for verified drafts,
        their distributions; then advance the grammar matchers through the new tokens."""
        bitmask = pending.result(forward.rows) if pending is not None else None
        spec = self.speculator
        output = self.runner.sample(plan, forward, grammar_bitmask=bitmask,
                                    draft_probs=spec.draft_probs if spec is not None else None)
        if self.structured is not None:
            self._fail(self.structured.accept(plan, output))
        return output

    def _fail(self, failures: list[tuple[str, str]]) -> None:
        for request_id, error in failures:
            self.outputs.dispatch(self.scheduler.abort(request_id, reason=FinishReason.ERROR, error=error))

    def _wake(self) -> None:
        with self._cv:
            self._cv.notify()

    def _wait_while_idle(self) -> None:
        """Nothing was schedulable because every request waits for its grammar: sleep until a compile
        ends, a request or abort arrives, or the earliest compile deadline (never spin, never stall)."""
        if not self._idle or self.structured is None:
            return
        with self._cv:
            wait = self.structured.compiles.idle_wait_s()
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
            t0, steps = time.perf_counter(), self._steps
            try:
                self.step()
            except Exception as e:  # a failed step fails its requests, never the loop
                log.exception("engine step failed")
                self._finish_all(FinishReason.ERROR, f"engine error: {type(e).__name__}: {e}")
            clock.add_busy(time.perf_counter() - t0)
            if self.config.execution.test_step_delay_s and self._steps != steps:
                # test_step_delay_s (a setting for tests only): after a step, outside its timing, wait unless an
                # abort arrives or the engine stops (neither waits for the delay)
                end = time.monotonic() + self.config.execution.test_step_delay_s
                with self._cv:
                    while not self._stopping and not any(isinstance(m, AbortRequest) for m in self._inbox) \
                            and (left := end - time.monotonic()) > 0:
                        self._cv.wait(left)
            self._wait_while_idle()

    def _drain_inbox(self) -> None:
        with self._cv:
            items = list(self._inbox)
            self._inbox.clear()
        self.outputs.dispatch(apply_messages(items, self.scheduler, self._steps))

    def _finish_all(self, reason: FinishReason, error: str | None) -> None:
        """End every request the scheduler holds (or that was never admitted) with a final output."""
        outs = []
        for rid in list(self.scheduler.request_ids()):
            outs.extend(self.scheduler.abort(rid, reason=reason, error=error))
        self.outputs.dispatch(outs)
        leftover = self.outputs.in_flight()
        self.outputs.dispatch([RequestOutput(rid, 0, [], finished=True, request_finished=True, finish_reason=reason,
                                      error=error) for rid in leftover])

    # ---- convenience for tests and benchmarks ------------------------------------
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams],
                 timeout: float = 600.0) -> list[list[RequestOutput]]:
        """Submit every prompt, wait for all, return each request's outputs in order (generate.py)."""
        return generate(self, prompts, params, timeout)

    def run_inline(self) -> None:
        """Without a loop thread (``start()`` not called): step on the caller's thread until no work is left."""
        if self._thread is None:
            while self.has_work():
                self.step()
                self._wait_while_idle()
