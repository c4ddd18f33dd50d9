"""backend/engine/loop_clock.py: the loop thread's busy time split into CPU, run queue and blocked (GIL)."""
from __future__ import annotations

import sys
import threading
import time

import pytest

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.loop_clock import LoopClock, LoopTime, parse_schedstat
from contracts.sampling_params import SamplingParams


def test_parse_schedstat():
    assert parse_schedstat("1500000000 250000000 42\n") == (1.5, 0.25)
    with pytest.raises(ValueError, match="schedstat"):
        parse_schedstat("17")


def test_blocked_is_what_is_left_and_never_negative():
    t = LoopTime(busy_s=2.0, cpu_s=1.25, runqueue_s=0.5)
    assert t.blocked_s == 0.25
    assert LoopTime(busy_s=1.0, cpu_s=1.0001, runqueue_s=0.0).blocked_s == 0.0
    assert LoopTime(busy_s=2.0, cpu_s=1.5, runqueue_s=None).blocked_s == 0.5   # no run queue: all in blocked
    d = LoopTime(busy_s=3.0, cpu_s=2.0, runqueue_s=0.75).since(t)
    assert (d.busy_s, d.cpu_s, d.runqueue_s) == (1.0, 0.75, 0.25)
    assert LoopTime(3.0, 2.0, None).since(t).runqueue_s is None


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def measured_thread(work) -> tuple[LoopClock, LoopTime]:
    """Run ``work`` on a new thread whose clock counts it as busy; (clock, its total read on that thread)."""
    got = {}

    def run():
        clock = LoopClock.for_current_thread()
        t0 = time.perf_counter()
        work()
        clock.add_busy(time.perf_counter() - t0)
        got["clock"], got["total"] = clock, clock.total()
    th = threading.Thread(target=run)
    th.start()
    th.join()
    return got["clock"], got["total"]


def test_sleep_is_blocked_and_computing_is_cpu_or_run_queue():
    clock, t = measured_thread(lambda: (time.sleep(0.1), spin(0.1)))
    assert t.busy_s >= 0.2
    assert t.blocked_s >= 0.09                                  # asleep: neither on a core nor runnable
    assert t.cpu_s + (t.runqueue_s or 0.0) >= 0.09              # spinning: on a core, or waiting for one
    assert clock.total() == t                                   # the thread has ended: its last reading stays


def test_waiting_for_the_gil_counts_as_blocked():
    """Another thread computing in Python holds the GIL about half of the time: the measured thread, computing
    in Python too, is off its core about half of its busy time, asleep on the GIL (blocked), or, once woken,
    waiting for a core (run queue: how much depends on the machine's load)."""
    stop = threading.Event()

    def hog():
        while not stop.is_set():
            pass
    old = sys.getswitchinterval()
    sys.setswitchinterval(0.005)
    other = threading.Thread(target=hog)
    other.start()
    try:
        _, t = measured_thread(lambda: spin(0.4))
    finally:
        stop.set()
        other.join()
        sys.setswitchinterval(old)
    assert t.cpu_s <= 0.75 * t.busy_s, t
    assert t.blocked_s >= 0.1 * t.busy_s, t


def test_engine_reports_its_loop_thread(tiny_checkpoint):
    engine = LLMEngine(EngineConfig.from_settings(model_path=str(tiny_checkpoint), kv_cache_bytes=8 << 20,
                                                  max_model_len=256))
    assert engine.stats().loop is None                          # no loop thread yet
    engine.start()
    try:
        engine.generate([[1, 2, 3]], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
        t = engine.stats().loop
        assert t is not None and t.busy_s > 0 and t.cpu_s > 0
        assert t.cpu_s + (t.runqueue_s or 0.0) + t.blocked_s >= t.busy_s - 1e-9
    finally:
        engine.shutdown()
    after = engine.stats().loop
    assert after is not None and after.busy_s >= t.busy_s       # the last reading outlives the thread


def test_engine_sets_the_switch_interval_while_its_loop_runs(tiny_checkpoint):
    before = sys.getswitchinterval()
    engine = LLMEngine(EngineConfig.from_settings(model_path=str(tiny_checkpoint), kv_cache_bytes=8 << 20,
                                                  max_model_len=256,
                                                  python_switch_interval_ms=0.25))
    assert sys.getswitchinterval() == before                    # building does not touch it
    engine.start()
    try:
        assert sys.getswitchinterval() == pytest.approx(0.00025)
    finally:
        engine.shutdown()
    assert sys.getswitchinterval() == before                    # put back


def test_engine_leaves_a_switch_interval_changed_meanwhile(tiny_checkpoint):
    before = sys.getswitchinterval()
    engine = LLMEngine(EngineConfig.from_settings(model_path=str(tiny_checkpoint), kv_cache_bytes=8 << 20,
                                                  max_model_len=256,
                                                  python_switch_interval_ms=0.25)).start()
    try:
        sys.setswitchinterval(0.002)                            # someone else's choice, after start()
        engine.shutdown()
        assert sys.getswitchinterval() == pytest.approx(0.002)
    finally:
        sys.setswitchinterval(before)
