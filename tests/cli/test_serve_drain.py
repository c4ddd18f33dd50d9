"""cli/serve.py SIGTERM drain (TRITON_LLM_DRAIN_SECONDS): in-flight streams finish before tritonserver
stops. Unit tests of the pieces, and the real server: with the drain every stream ends normally; without
it (Triton's own graceful stop) the ensemble's streams stall, which is why the drain exists."""
from __future__ import annotations

import http.server
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.helm.chart import files_with_string_literal
from cli.serve import ACTIVE_GAUGE, DRAIN_ENV, active_requests, drain, drain_seconds_from_env
from cli.launcher import REPO, LauncherError, Ports


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def test_drain_waits_for_a_quiet_engine():
    clock = FakeClock()
    readings = iter([3, 2, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0])
    assert drain(lambda: next(readings), 60, quiet_s=2.0, poll_s=0.5, clock=clock, sleep=clock.sleep)
    assert clock.t == pytest.approx(3 * 0.5 + 2.0)  # 3 busy polls, then 2 s of zeros


def test_drain_restarts_the_quiet_time_when_a_request_arrives():
    clock = FakeClock()
    readings = iter([0, 0, 1, 0, 0, 0, 0, 0, 0])
    assert drain(lambda: next(readings), 60, quiet_s=1.0, poll_s=0.5, clock=clock, sleep=clock.sleep)
    assert clock.t == pytest.approx(2.5)


def test_drain_gives_up_at_the_deadline():
    clock = FakeClock()
    assert not drain(lambda: 1, 10, poll_s=0.5, clock=clock, sleep=clock.sleep)
    assert clock.t == pytest.approx(10)


def test_drain_without_a_gauge_does_not_wait_but_a_lost_answer_later_is_unknown():
    clock = FakeClock()
    assert drain(lambda: None, 60, clock=clock, sleep=clock.sleep) and clock.t == 0
    readings = iter([2, None, None, 1, None, 0, 0, 0, 0, 0, 0, 0])
    assert drain(lambda: next(readings), 60, quiet_s=1.0, poll_s=0.5, clock=clock, sleep=clock.sleep)
    assert clock.t == pytest.approx(5 * 0.5 + 1.0)


def test_drain_seconds_from_env():
    assert drain_seconds_from_env({}) == 0 and drain_seconds_from_env({DRAIN_ENV: " "}) == 0
    assert drain_seconds_from_env({DRAIN_ENV: "120"}) == 120
    for bad in ("soon", "-1", "1e9"):
        with pytest.raises(LauncherError, match=DRAIN_ENV):
            drain_seconds_from_env({DRAIN_ENV: bad})


METRICS = """# HELP nv_trt_llm_request_metrics Request counts of the engine's scheduler
# TYPE nv_trt_llm_request_metrics gauge
nv_trt_llm_request_metrics{model="llm",request_type="waiting",version="1"} 1
nv_trt_llm_request_metrics{model="llm",request_type="active",version="1"} 3
nv_trt_llm_request_metrics{model="llm2",request_type="active",version="1"} 2
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="used",model="llm",version="1"} 40
"""


@pytest.fixture
def metrics_server():
    pages = {"/metrics": METRICS, "/empty": "nv_inference_count 1\n"}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = pages.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.end_headers()
            self.wfile.write((body or "").encode())

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_the_gauge_the_drain_reads_is_one_the_llm_model_exports():
    family, label = ACTIVE_GAUGE[0].rstrip("{"), ACTIVE_GAUGE[1]
    sources = files_with_string_literal(family)
    assert sources, f"no Python source defines the metric family {family!r} any more"
    key, value = label.split("=")
    text = "\n".join(p.read_text() for p in sources)
    assert f'"{key}"' in text and f'"{value.strip(chr(34))}"' in text, (label, sources)


def test_active_requests_reads_the_engine_gauge(metrics_server):
    assert active_requests(f"{metrics_server}/metrics") == 5
    assert active_requests(f"{metrics_server}/empty") is None
    assert active_requests(f"{metrics_server}/missing") is None
    assert active_requests("http://127.0.0.1:9/metrics", timeout=0.5) is None


# ---- the real server -----------------------------------------------------------------------------

def sigterm_during_streams(drain_s: int, n: int = 3, max_tokens: int = 300,
                           client_timeout: float = 60) -> tuple[list, int, float, str]:
    """Start `python -m cli.serve`, stream n requests, SIGTERM it once every stream has its first tokens.
    Returns ([(ok, tokens, finish_reason or error)], launcher exit code, seconds from SIGTERM to exit,
    the launcher's output)."""
    from cli.client import stream

    ports = Ports.free()
    env = dict(os.environ, HTTP_PORT=str(ports.http), GRPC_PORT=str(ports.grpc), METRICS_PORT=str(ports.metrics),
               # the step delay (a setting for tests only) keeps every stream running 3 s at least on any CPU, so
               # SIGTERM comes while all are in flight
               TRITON_LLM_SET="llm.kv_cache_bytes=16MiB llm.speculative_method=none llm.test_step_delay_s=0.01",
               TRITON_LLM_SERVER_ARGS="--exit-timeout-secs=15", **{DRAIN_ENV: str(drain_s)})
    proc = subprocess.Popen([sys.executable, "-m", "cli.serve"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 300
        while not any(line.startswith("ready:") for line in out):
            assert proc.poll() is None and time.monotonic() < deadline, "".join(out)[-4000:]
            time.sleep(0.2)
        started = threading.Barrier(n + 1)
        results: dict[int, tuple] = {}

        def run(i: int) -> None:
            tokens, first = 0, True
            try:
                for chunk in stream(f"localhost:{ports.grpc}", "def fibonacci(n):", max_tokens, timeout=client_timeout,
                                    temperature=0.0, min_tokens=max_tokens, exclude_input_in_output=True):
                    tokens = max(tokens, chunk.num_output_tokens)
                    if first:
                        first = False
                        started.wait(timeout=120)
                    if chunk.final:
                        results[i] = (True, tokens, chunk.finish_reason)
            except Exception as e:  # noqa: BLE001 - what the client saw
                results[i] = (False, tokens, type(e).__name__)
                if first:
                    started.abort()

        threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        started.wait(timeout=120)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=120)
        took = time.monotonic() - sent
        for t in threads:
            t.join(timeout=90)
        reader.join(timeout=10)
        return [results.get(i, (False, 0, "no final response")) for i in range(n)], code, took, "".join(out)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.e2e
@pytest.mark.slow
def test_sigterm_drains_in_flight_streams():
    results, code, took, out = sigterm_during_streams(drain_s=120)
    assert results == [(True, 300, "length")] * 3, results
    assert "drained" in out and took < 90, (took, out[-3000:])
    # nothing was in flight when tritonserver was told to stop. (Now and then 2.51 then keeps the
    # `ensemble` model "live" until the exit timeout and exits 1, with every request long answered.)
    assert not re.search(r"has [1-9]\d* in-flight inferences", out), out[-3000:]
    assert code == 0 or "Exit timeout expired" in out, (code, out[-3000:])


@pytest.mark.e2e
@pytest.mark.slow
def test_without_the_drain_tritons_own_stop_cuts_ensemble_streams():
    """Documents Triton 2.51: once stopping it refuses an ensemble's next steps (FAILED_ENQUEUE), so the
    streams stall (and tritonserver's exit waits until the clients give up). If this starts failing, Triton
    drains ensembles itself and the drain can go."""
    results, _, _, _ = sigterm_during_streams(drain_s=0, client_timeout=15)
    assert not any(ok and tokens == 300 for ok, tokens, _ in results), results
