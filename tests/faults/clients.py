"""Streaming clients for the fault tests, one thread each: direct to Triton's ensemble (tritonclient), through
the gateway's gRPC API, through its OpenAI HTTP API (SSE). Each records when its first tokens came, when and
how its stream ended, so a test can say how long a fault took to reach every client."""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field

import grpc
import httpx

from cli.client import build_inputs
from tests.e2e.helpers import Stream
from triton_llm.v1 import llm_service_pb2 as pb
from triton_llm.v1 import llm_service_pb2_grpc as pb_grpc

PROMPT = "def parse(lines):\n"


@dataclass
class Outcome:
    kind: str                                  # direct | grpc | http
    started: threading.Event = field(default_factory=threading.Event)   # first tokens received
    ended_at: float | None = None              # time.monotonic() of the end
    ok: bool = False                           # a final response (not an error)
    error: str = ""                            # the error: a gRPC code name, an HTTP status, an SSE error's text
    tokens: int = 0
    text: str = ""

    def end(self, ok: bool, error: str = "") -> None:
        self.ok, self.error, self.ended_at = ok, error, time.monotonic()


def direct(url: str, out: Outcome, max_tokens: int, timeout: float) -> None:
    with Stream(url) as s:
        rid = s.send(build_inputs(PROMPT, max_tokens, min_tokens=max_tokens, temperature=0.0, stream=True,
                                  exclude_input_in_output=True))
        deadline = time.monotonic() + timeout
        while True:
            try:
                _, chunk = s.pump(max(0.01, deadline - time.monotonic()))
            except Exception:          # queue.Empty: no response in time (a hang)
                return out.end(False, "hang")
            if chunk is None:
                return out.end(False, s.results[rid].error or "error")
            out.tokens = max(out.tokens, chunk.num_output_tokens)
            out.text += chunk.text
            out.started.set()
            if chunk.final:
                return out.end(True)


def gateway_grpc(target: str, out: Outcome, max_tokens: int, timeout: float, request_id: str = "",
                 options: list | None = None) -> None:
    with grpc.insecure_channel(target, options=options or []) as ch:
        req = pb.GenerateRequest(prompt=PROMPT, max_tokens=max_tokens, min_tokens=max_tokens, temperature=0.0,
                                 stream=True, request_id=request_id)
        try:
            for msg in pb_grpc.LLMServiceStub(ch).Generate(req, timeout=timeout):
                out.tokens = max(out.tokens, msg.num_output_tokens)
                out.text += msg.text
                out.started.set()
            out.end(True)
        except grpc.RpcError as e:
            out.end(False, e.code().name)


def gateway_http(base_url: str, model: str, out: Outcome, max_tokens: int, timeout: float) -> None:
    body = {"model": model, "prompt": PROMPT, "max_tokens": max_tokens, "min_tokens": max_tokens,
            "temperature": 0.0, "stream": True}
    try:
        with httpx.stream("POST", base_url + "/v1/completions", json=body, timeout=timeout) as r:
            if r.status_code != 200:
                r.read()
                return out.end(False, f"HTTP {r.status_code}")
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[len("data: "):]
                if data == "[DONE]":
                    return out.end(True)
                event = json.loads(data)
                if "error" in event:
                    return out.end(False, f"SSE error: {event['error'].get('message', '')}")
                out.text += "".join(c.get("text", "") for c in event.get("choices", []))
                out.tokens += 1
                out.started.set()
        out.end(False, "SSE stream cut without [DONE] or an error event")
    except httpx.HTTPError as e:
        out.end(False, f"HTTP {type(e).__name__}")


def start(target, *args, **kwargs) -> threading.Thread:
    t = threading.Thread(target=target, args=args, kwargs=kwargs, daemon=True)
    t.start()
    return t


def gateway_http_whole(base_url: str, model: str, out: Outcome, max_tokens: int, timeout: float) -> None:
    """A non-streamed completion: one answer, a JSON error's status on failure."""
    body = {"model": model, "prompt": PROMPT, "max_tokens": max_tokens, "min_tokens": max_tokens,
            "temperature": 0.0}
    out.started.set()
    try:
        r = httpx.post(base_url + "/v1/completions", json=body, timeout=timeout)
    except httpx.HTTPError as e:
        return out.end(False, f"HTTP {type(e).__name__}")
    if r.status_code == 200:
        out.text = r.json()["choices"][0]["text"]
        return out.end(True)
    out.end(False, f"HTTP {r.status_code}")
    out.text = r.headers.get("retry-after", "")
