"""Client-side helpers for the end-to-end tests: run requests over gRPC streams, read metrics."""
from __future__ import annotations

import os
import queue
import re
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

import tritonclient.grpc as grpcclient

from cli.client import OUTPUTS, Chunk, build_inputs, parse_result

MODEL = "ensemble"


@dataclass
class Result:
    chunks: list[Chunk] = field(default_factory=list)
    error: str | None = None

    @property
    def text(self) -> str:
        return "".join(c.text for c in self.chunks)

    @property
    def finish_reason(self) -> str:
        reasons = [c.finish_reason for c in self.chunks if c.finish_reason]
        return reasons[-1] if reasons else ""

    @property
    def num_output_tokens(self) -> int:
        return max((c.num_output_tokens for c in self.chunks), default=0)

    @property
    def num_final(self) -> int:
        return sum(c.final for c in self.chunks)


def raw_input(name: str, arr, dtype: str):
    inp = grpcclient.InferInput(name, list(arr.shape), dtype)
    inp.set_data_from_numpy(arr)
    return inp


def requested_outputs():
    return [grpcclient.InferRequestedOutput(o) for o in OUTPUTS]


class Stream:
    """One gRPC bidirectional stream; ``send`` requests, ``collect`` each one's responses by id."""

    def __init__(self, url: str, headers: dict[str, str] | None = None):
        self.client = grpcclient.InferenceServerClient(url)
        self._q: queue.Queue = queue.Queue()
        # headers: gRPC metadata of the stream, e.g. a W3C traceparent
        self.client.start_stream(callback=lambda result, error: self._q.put((result, error)), headers=headers)
        self.results: dict[str, Result] = {}
        self.on_chunk: Callable[[str, Chunk], None] | None = None

    def send(self, inputs: list, request_id: str | None = None, model: str = MODEL) -> str:
        rid = request_id or uuid.uuid4().hex
        self.results.setdefault(rid, Result())
        self.client.async_stream_infer(model, inputs, request_id=rid, outputs=requested_outputs(),
                                       enable_empty_final_response=True)
        return rid

    def pump(self, timeout: float) -> tuple[str, Chunk | None]:
        """Wait for one response; returns (request id, chunk) or (request id, None) for an error."""
        result, error = self._q.get(timeout=timeout)
        if error is not None:
            # Errors carry no request id on this API: attribute them to the oldest unfinished request.
            rid = next((r for r, res in self.results.items() if not res.num_final and res.error is None), "?")
            self.results.setdefault(rid, Result()).error = error.message()
            return rid, None
        rid = result.get_response().id
        chunk = parse_result(result)
        self.results.setdefault(rid, Result()).chunks.append(chunk)
        if self.on_chunk:
            self.on_chunk(rid, chunk)
        return rid, chunk

    def wait(self, rids, timeout: float = 120.0) -> dict[str, Result]:
        deadline = time.monotonic() + timeout
        pending = set(rids)
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no final response for {sorted(pending)} within {timeout}s")
            rid, chunk = self.pump(left)
            if chunk is None or chunk.final:
                pending.discard(rid)
        return {r: self.results[r] for r in rids}

    def close(self, cancel: bool = False) -> None:
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def run(url: str, prompt: str | bytes, max_tokens: int, timeout: float = 120.0, **options: Any) -> Result:
    """One request on its own stream, to its final response (or error)."""
    with Stream(url) as s:
        rid = s.send(build_inputs(prompt, max_tokens, **options))
        return s.wait([rid], timeout)[rid]


def run_inputs(url: str, inputs: list, timeout: float = 60.0) -> Result:
    with Stream(url) as s:
        rid = s.send(inputs)
        return s.wait([rid], timeout)[rid]


_LINE = re.compile(r'^(\w+)\{([^}]*)\}\s+(\S+)$')


def metrics(url: str) -> dict[tuple[str, frozenset], float]:
    """Prometheus text from the metrics port as {(name, frozenset(label items)): value}."""
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    out = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if m:
            labels = frozenset(tuple(kv.split("=", 1)) for kv in re.findall(r'\w+="[^"]*"', m.group(2)))
            labels = frozenset((k, v.strip('"')) for k, v in labels)
            out[(m.group(1), labels)] = float(m.group(3))
    return out


def gauge(url: str, name: str, **labels: str) -> float:
    want = set(labels.items())
    for (n, ls), v in metrics(url).items():
        if n == name and want <= set(ls):
            return v
    raise KeyError(f"metric {name}{labels} not found")


def kv_used(url: str) -> float:
    return gauge(url, "nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="used")


def wait_until(predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.05) -> float:
    """Poll until ``predicate()``; returns the seconds it took, fails with ``what`` on timeout."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out after {timeout}s waiting for: {what}")
        time.sleep(interval)
    return time.monotonic() - start


def steps(url: str) -> float:
    return gauge(url, "nv_trt_llm_general_metrics", general_type="iteration_counter")


def engine_idle(url: str, what: str, timeout: float = 15.0, settle: float = 0.5) -> float:
    """Wait until no KV block is used, no request is active and the engine's iteration counter has
    not moved for ``settle`` seconds (the gauges refresh periodically); returns the counter."""
    start = last_change = time.monotonic()
    last = None
    while True:
        now = (steps(url), kv_used(url), gauge(url, "nv_trt_llm_request_metrics", request_type="active"))
        if now != last:
            last, last_change = now, time.monotonic()
        elif now[1] == 0 and now[2] == 0 and time.monotonic() - last_change >= settle:
            return now[0]
        if time.monotonic() - start > timeout:
            raise AssertionError(f"engine not idle {timeout}s after {what}: (steps, kv used, active) = {now}")
        time.sleep(0.05)


# ---- the gateway as a process ----------------------------------------------------------------------------

GATEWAY_ENV = ("GATEWAY_AUTH_TOKEN_FILE", "GATEWAY_AUTH_TOKENS", "GATEWAY_TLS_CERT", "GATEWAY_TLS_KEY",
               "GATEWAY_LISTEN", "GATEWAY_TRITON_URL", "GATEWAY_MAX_INFLIGHT")


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without the gateway's own settings, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in GATEWAY_ENV}
    env.update(extra)
    return env


def start_gateway(server, log_dir, *, env=None, args=(), openai: bool = False):
    """``python -m gateway`` in front of ``server`` (a TritonServer), SERVING; the caller stops it. ``openai``:
    also its OpenAI HTTP API, serving Triton's metrics at ``/metrics``."""
    from cli.gateway_process import GatewayProcess
    from cli.launcher import free_port

    http = dict(openai_listen=f"127.0.0.1:{free_port()}", triton_metrics_url=server.metrics_url) if openai else {}
    return GatewayProcess(f"127.0.0.1:{free_port()}", server.grpc_url, env=env or clean_env(),
                          extra_args=["--health-interval-s", "0.2", *args], log_path=log_dir / "gateway.log",
                          **http).start_ready()
