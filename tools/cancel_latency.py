"""How fast a cancellation reaches the engine: ``python -m tools.cancel_latency [--trials N] [--json PATH]``.

Starts tritonserver on the shipped model repository (its engine settings as shipped, on the CPU) and the gateway
(gRPC and the OpenAI HTTP API) in front of it, then, one request at a time:
- ``deadline``: a gRPC ``Generate`` with a deadline (cycling through ``DEADLINES_S``) that it cannot meet;
- ``disconnect``: a streaming ``/v1/completions`` whose client closes the connection after a few events.
Each request asks for ``MAX_TOKENS`` tokens (``min_tokens`` too, sampled at temperature 1 so that n-gram drafts
rarely shorten it); a trial whose request finished first is counted and left out. The engine's side comes from the
request's log line (backend/serving/request_log.py): ``arrival_unix`` places it on the wall clock, ``stop_s`` is
when the stop reached the ``llm`` model, ``last_step_s`` when the request's last engine step ended, ``e2e_s`` when
the engine freed it, ``steps_after_stop`` the steps that ended in between. The client's event (the deadline, the
close) is on the same machine's wall clock. Prints, per kind, the median and the largest of: event -> stop at the
``llm`` model, stop -> last step, event -> last step, event -> freed; and the steps after the stop.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import grpc
import httpx

from cli.gateway_process import GatewayProcess
from cli.launcher import Ports, TritonServer, free_port, render_model_repository

DEADLINES_S = (0.1, 0.2, 0.3, 0.5)
MAX_TOKENS = 1000
PROMPT = "def parse(lines):\n"
EVENTS_BEFORE_CLOSE = 3


def log_line(log_path: Path, request_id: str, timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    needle = f'"request_id":"{request_id}"'
    while time.monotonic() < deadline:
        for text in log_path.read_text(errors="replace").splitlines():
            if text.startswith('{"event":"request_finished"') and needle in text:
                return json.loads(text)
        time.sleep(0.05)
    raise TimeoutError(f"no log line for {request_id} within {timeout} s")


def figures(line: dict, event_unix: float) -> dict:
    """The engine's side of one cancelled request, in seconds from the client's event."""
    at = line["arrival_unix"]
    return {"stop_reached_llm_s": at + line["stop_s"] - event_unix if line["stop_s"] is not None else None,
            "stop_to_last_step_s": line["last_step_s"] - line["stop_s"] if line["stop_s"] is not None else None,
            "last_step_s": at + line["last_step_s"] - event_unix, "freed_s": at + line["e2e_s"] - event_unix,
            "steps_after_stop": line["steps_after_stop"], "stopped_by": line["stopped_by"]}


def deadline_trial(target: str, i: int, deadline_s: float) -> tuple[float, str] | None:
    """(the deadline on the wall clock, the request id), or None when the request finished in time."""
    from triton_llm.v1 import llm_service_pb2 as pb
    from triton_llm.v1 import llm_service_pb2_grpc as pb_grpc

    rid = f"cl-deadline-{i}"
    req = pb.GenerateRequest(prompt=PROMPT, max_tokens=MAX_TOKENS, min_tokens=MAX_TOKENS, temperature=1.0,
                             stream=True, request_id=rid)
    with grpc.insecure_channel(target) as ch:
        sent = time.time()
        try:
            for _ in pb_grpc.LLMServiceStub(ch).Generate(req, timeout=deadline_s):
                pass
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                return sent + deadline_s, rid
            raise
    return None


def disconnect_trial(base_url: str, model: str, i: int) -> tuple[float, str] | None:
    """(when the client closed its connection, the request id), or None when the stream ended first."""
    body = {"model": model, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "min_tokens": MAX_TOKENS,
            "temperature": 1.0, "seed": i, "stream": True}
    rid, events = None, 0
    with httpx.stream("POST", base_url + "/v1/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line == "data: [DONE]":
                return None
            if line.startswith("data: {"):
                rid = rid or json.loads(line[len("data: "):])["id"].removeprefix("cmpl-")
                events += 1
                if events >= EVENTS_BEFORE_CLOSE:
                    break
        closed = time.time()        # leaving the block closes the connection
    return closed, rid


def summary(rows: list[dict]) -> dict:
    out: dict = {"trials": len(rows)}
    for key in ("stop_reached_llm_s", "stop_to_last_step_s", "last_step_s", "freed_s"):
        values = [r[key] for r in rows if r[key] is not None]
        if values:
            out[key] = {"p50_ms": round(statistics.median(values) * 1000, 1), "max_ms": round(max(values) * 1000, 1)}
    out["steps_after_stop"] = {str(n): sum(r["steps_after_stop"] == n for r in rows)
                               for n in sorted({r["steps_after_stop"] for r in rows}, key=str)}
    out["stopped_by"] = sorted({r["stopped_by"] for r in rows}, key=str)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=20, help="trials of each kind (default 20)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="cancel-latency-"))
    print(f"server and gateway logs: {root}")
    # the shipped engine settings; the metrics refresh faster only so that "idle" is seen sooner between trials
    repo = render_model_repository(root / "model_repository", {"llm": {"device": "cpu", "metrics_interval_s": "0.1"}})
    server = TritonServer(repo, Ports.free(), log_path=root / "server.log", extra_args=["--exit-timeout-secs=10"])
    gateway = GatewayProcess(f"127.0.0.1:{free_port()}", server.grpc_url, openai_listen=f"127.0.0.1:{free_port()}",
                             triton_metrics_url=server.metrics_url, log_path=root / "gateway.log")
    rows: dict[str, list[dict]] = {"deadline": [], "disconnect": []}
    finished_first = {"deadline": 0, "disconnect": 0}
    try:
        server.start()
        server.wait_ready(timeout=300)
        gateway.start()
        gateway.wait_ready(timeout=60)
        model = httpx.get(gateway.openai_url + "/v1/models", timeout=10).json()["data"][0]["id"]
        for i in range(args.trials):
            for kind in ("deadline", "disconnect"):
                got = (deadline_trial(gateway.target, i, DEADLINES_S[i % len(DEADLINES_S)]) if kind == "deadline"
                       else disconnect_trial(gateway.openai_url, model, i))
                if got is None:
                    finished_first[kind] += 1
                    continue
                event, rid = got
                rows[kind].append(figures(log_line(server.log_path, rid), event))
                time.sleep(0.3)     # the next trial starts on an idle engine
    finally:
        gateway.stop()
        server.stop(timeout=30)
    report = {kind: {**summary(r), "finished_before_the_event": finished_first[kind]} for kind, r in rows.items()}
    for kind, figs in report.items():
        print(f"{kind}: {json.dumps(figs)}")
    if args.json:
        args.json.write_text(json.dumps({"summary": report, "trials": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
