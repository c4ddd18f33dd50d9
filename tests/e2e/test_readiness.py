"""Readiness tells the truth: when the engine loop dies or stalls inside the real tritonserver, the
in-flight request ends with an error naming the cause, /v2/health/ready stops answering 200 within
seconds, the log says why, and the server exits (its orchestrator replaces it).

Each case runs its own server, whose llm model.py is the shipped one plus a test-only hook: a thread
that, once the test writes a trigger file, replaces the engine's step with one that raises SystemExit
(the loop thread dies) or blocks (the loop stalls)."""
from __future__ import annotations

import time
import urllib.error
import urllib.request

import pytest

from tests.e2e.helpers import Stream
from cli.client import build_inputs
from cli.launcher import Ports, TritonServer, render_model_repository

HOOK = '''

# ---- test-only fault injection (tests/e2e/test_readiness.py) ----
import os as _os
import threading as _threading
import time as _time

_TRIGGER = {trigger!r}
_initialize = TritonPythonModel.initialize


def _inject(self, args):
    _initialize(self, args)
    engine = self.serving.engine

    def wait_for_trigger():
        while not _os.path.exists(_TRIGGER):
            _time.sleep(0.05)
        fault = open(_TRIGGER).read().strip()

        def broken_step():
            if fault == "kill":
                raise SystemExit("injected fault: the engine loop thread dies")
            _threading.Event().wait()          # injected fault: the engine loop stalls forever
        engine.step = broken_step
    _threading.Thread(target=wait_for_trigger, daemon=True).start()


TritonPythonModel.initialize = _inject
'''


def http_ready(port: int) -> int | None:
    try:
        with urllib.request.urlopen(f"http://localhost:{port}/v2/health/ready", timeout=1) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None          # the server is gone: a probe fails just the same


@pytest.mark.parametrize("fault,stall_timeout", [("kill", "30"), ("stall", "2")])
def test_readiness_turns_false_when_the_engine_dies_or_stalls(tmp_path, model_path, fault, stall_timeout):
    trigger = tmp_path / "fault"
    repo = render_model_repository(tmp_path / "repo", {
        "llm": {"model_path": str(model_path), "kv_cache_bytes": "8MiB", "device": "cpu",
                "engine_stall_timeout_s": stall_timeout},
        "preprocess": {"tokenizer_path": str(model_path)}, "postprocess": {"tokenizer_path": str(model_path)},
    })
    model_py = repo / "llm" / "1" / "model.py"
    model_py.write_text(model_py.read_text() + HOOK.format(trigger=str(trigger)))
    srv = TritonServer(repo, Ports.free(), log_path=tmp_path / "server.log", extra_args=["--exit-timeout-secs=10"])
    srv.start()
    try:
        srv.wait_ready(timeout=300)
        assert http_ready(srv.ports.http) == 200
        trigger.write_text(fault)
        time.sleep(0.2)
        with Stream(srv.grpc_url) as s:
            t0 = time.monotonic()
            rid = s.send(build_inputs("def f(", 200, min_tokens=200, stream=True))
            res = s.wait([rid], timeout=60)[rid]
            assert res.error is not None and "engine unavailable" in res.error, (res.error, res.text)
        while http_ready(srv.ports.http) == 200 and time.monotonic() - t0 < 30:
            time.sleep(0.1)
        took = time.monotonic() - t0
        assert http_ready(srv.ports.http) != 200, "still ready 30 s after the engine broke"
        limit = 5 if fault == "kill" else float(stall_timeout) + 5
        assert took < limit, f"readiness turned false after {took:.1f} s"
        assert srv.proc.wait(timeout=30) is not None
        log = srv.log_tail(400)
        reason = "engine loop thread is not running" if fault == "kill" else "made no progress"
        assert f"engine unhealthy: the {reason}" in log or reason in log, log[-3000:]
        assert "asking tritonserver" in log
    finally:
        srv.stop()
