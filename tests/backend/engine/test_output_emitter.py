"""Outputs emitted off the loop thread (backend/engine/output_emitter.py): order kept, nothing lost
at shutdown, a failing or slow consumer does not stall the engine's steps."""
from __future__ import annotations

import threading
import time

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.output_emitter import OutputEmitter
from contracts.sampling_params import SamplingParams


def test_calls_run_in_order_and_survive_a_failing_callback():
    seen = []

    def boom(_):
        raise RuntimeError("consumer bug")

    em = OutputEmitter()
    em.submit([(seen.append, i) for i in range(5)] + [(boom, 5)] + [(seen.append, i) for i in range(6, 9)])
    assert em.flush(5)
    assert seen == [0, 1, 2, 3, 4, 6, 7, 8]
    em.stop()


def test_stop_from_inside_a_callback_does_not_deadlock():
    em = OutputEmitter()
    done = threading.Event()
    em.submit([(lambda _: (em.stop(timeout=1), done.set()), None)])
    assert done.wait(5)


def test_engine_callbacks_run_off_the_loop_in_order(tiny_checkpoint):
    engine = LLMEngine(EngineConfig(model_path=str(tiny_checkpoint), block_size=4)).start()
    threads, outs = set(), {f"r{i}": [] for i in range(4)}
    release = threading.Event()
    finished = threading.Semaphore(0)

    def cb(out):
        threads.add(threading.current_thread().name)
        if out.request_id == "r0" and not outs["r0"]:
            release.wait(5)   # a slow consumer: the loop keeps stepping meanwhile
        outs[out.request_id].append(out)
        if out.request_finished:
            finished.release()

    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    for rid in outs:
        engine.add_request(rid, [0, 7, 9, 11], params, cb)
    deadline = time.monotonic() + 30
    while engine.stats().steps < 8 and time.monotonic() < deadline:
        time.sleep(0.01)
    steps_while_blocked = engine.stats().steps
    release.set()
    for _ in outs:
        assert finished.acquire(timeout=30)
    engine.shutdown()
    assert steps_while_blocked >= 8, "the loop waited for a slow consumer"
    assert threads == {"llm-engine-output"}
    for rid, got in outs.items():
        assert sum(o.request_finished for o in got) == 1 and got[-1].request_finished, rid
        assert sum(len(o.new_token_ids) for o in got) == 12, rid


def test_shutdown_delivers_every_final_output(tiny_checkpoint):
    engine = LLMEngine(EngineConfig(model_path=str(tiny_checkpoint), block_size=4)).start()
    finals = []
    params = SamplingParams(max_tokens=500, temperature=0.0, ignore_eos=True)
    for i in range(3):
        engine.add_request(f"r{i}", [0, 7, 9], params, lambda out: finals.append(out) if out.request_finished else None)
    time.sleep(0.2)
    engine.shutdown()
    assert sorted(o.request_id for o in finals) == ["r0", "r1", "r2"]
