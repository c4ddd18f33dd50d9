"""Outputs emitted off the loop thread (backend/engine/output_emitter.py): order kept, nothing lost
at shutdown, a failing or slow consumer does not stall the engine's steps."""
from __future__ import annotations

import threading
import time

from backend.config import EngineConfig
from backend.core.outputs import FinishReason, RequestOutput, TokenLogprob
from backend.engine.llm_engine import LLMEngine
from backend.engine.output_emitter import OutputEmitter, coalesce
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


def out(rid, ids, seq=0, **kw):
    return RequestOutput(rid, seq, list(ids), num_output_tokens=kw.pop("total", 0), **kw)


def test_coalesce_merges_queued_outputs_of_a_sequence_in_the_earlier_place():
    a, b = (lambda _: None), (lambda _: None)
    calls = [(a, out("r1", [1], total=1)), (b, out("r2", [7], total=1)), (a, out("r1", [2, 3], total=3)),
             (b, out("r2", [8], total=2)), (a, out("r1", [4], total=4, finished=True, request_finished=True,
                                                   finish_reason=FinishReason.LENGTH))]
    got = coalesce(calls)
    assert [(cb, o.request_id) for cb, o in got] == [(a, "r1"), (b, "r2")]
    r1, r2 = got[0][1], got[1][1]
    assert r1.new_token_ids == [1, 2, 3, 4] and r1.num_output_tokens == 4
    assert r1.finished and r1.request_finished and r1.finish_reason is FinishReason.LENGTH
    assert r2.new_token_ids == [7, 8] and not r2.finished and r2.num_output_tokens == 2
    assert [o.new_token_ids for _, o in calls] == [[1], [7], [2, 3], [8], [4]]   # the inputs are not modified


def test_coalesce_keeps_finished_outputs_other_sequences_and_other_calls_apart():
    a = (lambda _: None)
    lp = [TokenLogprob(1, -0.5)]
    calls = [(a, out("r1", [1], seq=0, logprobs=lp)), (a, out("r1", [5], seq=1)), (a, out("r1", [2], seq=0)),
             (a, out("r2", [9], finished=True)), (a, out("r2", [], request_finished=True, finished=True)),
             (a, "not an output"), (a, out("r3", [4], logprobs=lp)), (a, out("r3", [6], logprobs=[TokenLogprob(6, -1.0)]))]
    got = [o for _, o in coalesce(calls)]
    # r1: sequence 1's output lies between sequence 0's two, which stay apart (order within the request kept)
    assert [(o.request_id, o.seq_index, o.new_token_ids) for o in got[:3]] == [("r1", 0, [1]), ("r1", 1, [5]),
                                                                            ("r1", 0, [2])]
    assert got[3].new_token_ids == [9] and got[4].request_finished   # a finished output takes nothing after it
    assert got[5] == "not an output"
    assert got[6].new_token_ids == [4, 6] and [lp.token_id for lp in got[6].logprobs] == [1, 6]


def test_a_slow_consumer_gets_the_outputs_that_queued_meanwhile_as_one():
    seen = []
    entered, release = threading.Event(), threading.Event()

    def cb(o):
        if not seen:
            entered.set()
            release.wait(5)
        seen.append(o)

    em = OutputEmitter()
    em.submit([(cb, out("r", [0], total=1))])
    assert entered.wait(5)
    for i in range(1, 6):   # the engine goes on while the consumer is busy
        em.submit([(cb, out("r", [i], total=i + 1, finished=i == 5, request_finished=i == 5))])
    release.set()
    assert em.flush(5)
    em.stop()
    assert [o.new_token_ids for o in seen] == [[0], [1, 2, 3, 4, 5]]
    assert seen[-1].request_finished and seen[-1].num_output_tokens == 6


def test_stop_from_inside_a_callback_does_not_deadlock():
    em = OutputEmitter()
    done = threading.Event()
    em.submit([(lambda _: (em.stop(timeout=1), done.set()), None)])
    assert done.wait(5)


def test_engine_callbacks_run_off_the_loop_in_order(tiny_checkpoint):
    engine = LLMEngine(EngineConfig.from_settings(model_path=str(tiny_checkpoint), block_size=4)).start()
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
    engine = LLMEngine(EngineConfig.from_settings(model_path=str(tiny_checkpoint), block_size=4)).start()
    finals = []
    params = SamplingParams(max_tokens=500, temperature=0.0, ignore_eos=True)
    for i in range(3):
        engine.add_request(f"r{i}", [0, 7, 9], params, lambda out: finals.append(out) if out.request_finished else None)
    time.sleep(0.2)
    engine.shutdown()
    assert sorted(o.request_id for o in finals) == ["r0", "r1", "r2"]
