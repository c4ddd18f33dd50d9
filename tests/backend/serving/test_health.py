"""The engine watchdog and what the llm model does when the engine is gone: the loop killed or stalled
(a real engine in this process), in-flight requests ended with an error, new ones refused."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import pytest

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.serving.health import EngineWatchdog
from backend.serving.llm_serving import LLMServing
from tests.backend.serving.test_llm_serving import FINAL, FakeEngine, llm_request, meta_of
from tests.helpers.triton_fakes import make_pb_utils


@dataclass
class _Stats:
    steps: int


class Engine:
    def __init__(self):
        self.alive, self.work, self.steps = True, False, 0

    def loop_alive(self):
        return self.alive

    def has_work(self):
        return self.work

    def stats(self):
        return _Stats(self.steps)


def test_watchdog_rules():
    now = [0.0]
    e = Engine()
    w = EngineWatchdog(e, lambda r: None, stall_timeout_s=5, clock=lambda: now[0])
    assert w.check() is None
    now[0] = 100.0                              # idle for long: fine
    assert w.check() is None
    e.work = True
    now[0] = 104.0
    assert w.check() is None                    # work, no step for 4 s < 5
    e.steps = 1
    now[0] = 108.0
    assert w.check() is None                    # progress resets the clock
    now[0] = 113.5
    assert "no progress for 5.5 s" in w.check()
    e.alive = False
    assert "not running" in w.check()


def test_watchdog_thread_reports_once():
    e, reasons = Engine(), []
    e.alive = False
    w = EngineWatchdog(e, reasons.append, stall_timeout_s=1, interval_s=0.01).start()
    time.sleep(0.2)
    w.stop()
    assert len(reasons) == 1 and w.reason == reasons[0]


def test_unhealthy_engine_fails_in_flight_and_refuses_new_requests():
    engine, pb = FakeEngine(), make_pb_utils()
    serving = LLMServing(engine, pb, cancel_poll_interval_s=0.01)
    try:
        r = llm_request()
        serving.execute([r])
        serving.engine_unhealthy("the engine loop thread is not running (it died)")
        (resp, flags), = r.sender.sent
        assert flags == FINAL and "engine unavailable: the engine loop thread is not running" in meta_of(resp).error
        r2 = llm_request()
        serving.execute([r2])
        (resp, flags), = r2.sender.sent
        assert flags == FINAL and meta_of(resp).error.startswith("engine unavailable:")
        assert len(engine.added) == 1
    finally:
        serving.shutdown()


@pytest.fixture
def live(tiny_checkpoint):
    engine = LLMEngine(EngineConfig.from_settings(model_path=str(tiny_checkpoint), device="cpu",
                                                  kv_cache_bytes=8 << 20)).start()
    serving = LLMServing(engine, make_pb_utils(), cancel_poll_interval_s=0.01)
    yield engine, serving
    serving.shutdown()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
@pytest.mark.parametrize("fault", ["kill", "stall"])
def test_a_killed_or_stalled_loop_is_detected_within_seconds(live, fault):
    engine, serving = live
    reasons, release = [], threading.Event()

    def broken_step():
        if fault == "kill":
            raise SystemExit("injected: the loop thread dies")   # escapes the loop's `except Exception`
        release.wait(30)                                         # stalls the loop

    engine.step = broken_step
    serving.watch(stall_timeout_s=1.0, action="fail_requests")
    serving.watchdog.on_unhealthy = lambda reason: (reasons.append(reason), serving.engine_unhealthy(reason))
    r = llm_request(max_tokens=50)
    t0 = time.monotonic()
    serving.execute([r])
    while not reasons and time.monotonic() - t0 < 10:
        time.sleep(0.05)
    release.set()
    took = time.monotonic() - t0
    assert reasons, "the watchdog did not notice"
    assert ("not running" if fault == "kill" else "no progress") in reasons[0]
    assert took < (2 if fault == "kill" else 3), took
    (resp, flags), = r.sender.sent
    assert flags == FINAL and meta_of(resp).error.startswith("engine unavailable:")
