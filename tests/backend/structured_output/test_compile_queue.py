"""The grammar compile queue: failures and deadlines come out of ``poll``, identical guides share a compile,
callbacks run on the compile threads, a dropped request is forgotten."""
from __future__ import annotations

import threading

import pytest

from backend.core.sequence import Sequence, SequenceStatus
from backend.structured_output.compile_queue import CompileQueue
from contracts.sampling_params import GuideSpec, SamplingParams
from tests.helpers.checkpoints import DEMO_TARGET

V = 4096


@pytest.fixture(scope="module")
def backend():
    from grammar import XGrammarBackend

    return XGrammarBackend.from_folder(DEMO_TARGET, V, [1])


def test_compile_failures_and_deadlines_come_out_of_poll(backend):
    clock = [0.0]
    gate = threading.Event()

    class Gated:
        vocab_size = V

        def cached(self, kind, guide):
            return None

        def compile(self, kind, guide):
            if guide == "bad":
                raise ValueError("guided_decoding_guide: not valid")
            gate.wait(5)
            return backend.compile(kind, guide)

        def matcher(self, compiled):
            return backend.matcher(compiled)

    so = CompileQueue(Gated, compile_timeout_s=10, max_workers=2, clock=lambda: clock[0])
    so.submit("bad", GuideSpec("regex", "bad"))
    failures = []
    for _ in range(500):
        failures += so.poll()
        if failures:
            break
        threading.Event().wait(0.01)
    assert failures == [("bad", "guided_decoding_guide: not valid")]
    so.submit("late", GuideSpec("regex", "late"))
    so.submit("late2", GuideSpec("regex", "late"))                   # the same guide: one compile
    assert so.num_compiles == 2
    assert so.poll() == [] and so.idle_wait_s() == 10.0
    clock[0] = 10.0
    failures = dict(so.poll())
    assert set(failures) == {"late", "late2"} and so.num_requests == 0
    assert failures["late"] == ("guided_decoding_guide: compiling the grammar took longer than "
                                "guided_compile_timeout_s (10 s)")
    gate.set()
    so.shutdown()


def test_a_compile_that_ends_at_once_calls_back_on_the_worker_thread(backend):
    """A guide that fails in microseconds must not run the manager's callback on the submitting
    thread (which holds the manager's lock inside submit: that would deadlock)."""
    class Instant:
        vocab_size = V

        def cached(self, kind, guide):
            return None

        def compile(self, kind, guide):
            raise ValueError("guided_decoding_guide: bad")

    so = CompileQueue(Instant)
    called_on = []
    so.set_event_callback(lambda: called_on.append(threading.current_thread().name))
    for i in range(50):
        so.submit(f"r{i}", GuideSpec("regex", f"g{i}"))
    for _ in range(500):
        if len(called_on) == 50:
            break
        threading.Event().wait(0.01)
    assert len(called_on) == 50 and all(n.startswith("grammar-compile") for n in called_on)
    assert len(dict(so.poll())) == 50
    so.shutdown()


def seq_of(rid: str) -> Sequence:
    return Sequence(seq_id=0, request_id=rid, seq_index=0, prompt_token_ids=[0], params=SamplingParams(),
                    status=SequenceStatus.WAITING)


def test_a_cached_guide_is_ready_at_once_and_a_dropped_request_is_forgotten(backend):
    so = CompileQueue(lambda: backend)
    assert so.warm_up() and so.backend is backend
    compiled = backend.compile("regex", "(yes|no)")
    so.submit("hit", GuideSpec("regex", "(yes|no)"))                 # served by the backend's cache
    assert so.compiled("hit") is compiled and so.is_ready(seq_of("hit")) and so.num_compiles == 0
    so.submit("miss", GuideSpec("regex", "[0-9]{3}"))
    assert so.num_compiles == 1 and so.compiled("miss") is None
    assert so.is_ready(seq_of("plain")) and so.compiled("plain") is None   # unguided: admitted at once
    so.drop("hit")
    so.drop("miss")
    assert so.num_requests == 0 and so.compiled("hit") is None and so.poll() == []
    so.shutdown()
