"""Soak test: N streamed requests, closed loop at concurrency C, against a running server or one started here.

    python -m tools.soak --requests 10000 --concurrency 32                   # starts its own server
    python -m tools.soak --url localhost:8001 --metrics-url http://localhost:8002/metrics --requests 2000
    python -m tools.soak --requests 10000 --gateway                  # half of them through a gateway it starts

The mix (seeded): prompts of varied length cut from the stdlib source, greedy and sampled requests,
a share the client cancels mid-stream (after 1-3 responses) and a share of bad inputs that preprocess
or the engine must reject with an error naming the input. Every request ends as one of:

- ``completed``: a final response with a finish reason; ``cancelled``: the client cancelled it;
- ``clean_error``: a bad input answered with an error naming its field;
- ``unexpected_error``: any other error (a good request that failed, or a bad one with a wrong message);
- ``hung``: nothing final within ``--request-timeout``; ``lost``: the stream closed with no final response.

With ``--gateway`` a share of the requests (``--gateway-share``) goes through a gateway process started here
(tools/soak_gateway.py). Afterwards it waits for the server to go idle and reads the KV blocks in use and
the active requests from the metrics port (both must be 0), and reports the RSS, open file descriptors and
threads of tritonserver, each Python backend stub and the gateway at the start, after warm-up, every
``--rss-every`` requests and at the end, their growth over the second half of the run, and requests/s; as
JSON (``--out``) and a short table. A server started here is stopped at the end and its shutdown time and
exit code are reported too (a 30 s shutdown means a request left the ensemble live: docs/serving.md).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

from cli.client import INPUT_TYPES, OUTPUTS, parse_result, to_array
from tools import soak_gateway
from tools.soak_mix import Plan, make_plans
from tools.server_watch import (count_sample, find_server_pid, rss_sample, second_half_growth, server_processes,
                                wait_idle)

OUTCOMES = ("completed", "cancelled", "clean_error", "unexpected_error", "hung", "lost")
@dataclass
class Outcome:
    index: int
    kind: str
    outcome: str
    seconds: float
    responses: int = 0
    detail: str = ""


@dataclass
class Report:
    config: dict
    counts: dict[str, int] = field(default_factory=dict)
    by_kind: dict[str, dict[str, int]] = field(default_factory=dict)
    seconds: float = 0.0
    requests_per_s: float = 0.0
    idle: dict[str, float | None] = field(default_factory=dict)
    rss_mib: list[dict] = field(default_factory=list)       # samples: {"at": label, "requests": n, pid name: MiB}
    fds: list[dict] = field(default_factory=list)           # the same for open file descriptors
    threads: list[dict] = field(default_factory=list)       # and for threads
    growth: dict[str, dict] = field(default_factory=dict)   # second half: {"rss_pct", "fds", "threads"}: {name: change}
    shutdown: dict[str, Any] = field(default_factory=dict)
    unexpected: list[str] = field(default_factory=list)     # the first few unexpected outcomes, for the reader


# ---- one request ------------------------------------------------------------------------------------

def _inputs(values: dict[str, Any], raw: dict[str, tuple[str, Any]] | None = None):
    import numpy as np
    import tritonclient.grpc.aio as grpcclient

    out = []
    for name, value in values.items():
        arr = to_array(name, value)
        inp = grpcclient.InferInput(name, list(arr.shape), INPUT_TYPES[name])
        inp.set_data_from_numpy(arr)
        out.append(inp)
    for name, (dtype, value) in (raw or {}).items():
        arr = np.asarray([[value]], dtype={"INT64": np.int64, "INT32": np.int32}[dtype])
        inp = grpcclient.InferInput(name, list(arr.shape), dtype)
        inp.set_data_from_numpy(arr)
        out.append(inp)
    return out


async def run_one(client, plan: Plan, *, model: str, timeout: float) -> Outcome:
    import tritonclient.grpc.aio as grpcclient

    outputs = [grpcclient.InferRequestedOutput(o) for o in OUTPUTS]
    done = asyncio.Event()

    async def requests():
        yield {"model_name": model, "inputs": _inputs(plan.values, plan.raw), "outputs": outputs,
               "request_id": uuid.uuid4().hex}
        await done.wait()

    t0 = time.perf_counter()
    responses = client.stream_infer(requests(), stream_timeout=timeout + 30)
    seen = 0

    def result(outcome: str, detail: str = "") -> Outcome:
        return Outcome(plan.index, plan.kind, outcome, time.perf_counter() - t0, seen, detail[:300])

    async def read() -> Outcome:
        nonlocal seen
        async for res, error in responses:
            if error is not None:
                msg = str(getattr(error, "message", lambda: error)())
                if plan.kind == "bad" and re.search(rf"(^|, ){plan.error_field}: ", msg):
                    return result("clean_error", msg)
                if plan.kind == "bad_triton" and re.search(plan.error_regex, msg):
                    return result("clean_error", msg)
                return result("unexpected_error", msg)
            chunk = parse_result(res)
            seen += 1
            if plan.kind == "cancel" and seen >= plan.cancel_after and not (chunk.final or chunk.finish_reason):
                responses.cancel()
                return result("cancelled")
            if chunk.final:
                if plan.kind.startswith("bad"):
                    return result("unexpected_error", "a bad input was served")
                return result("completed") if chunk.finish_reason or plan.kind == "cancel" else \
                    result("lost", "final response without a finish reason")
        return result("lost", "the stream closed before a final response")

    try:
        out = await asyncio.wait_for(read(), timeout)
    except asyncio.TimeoutError:
        out = result("hung", f"no final response within {timeout:.0f} s")
        responses.cancel()
    except Exception as e:  # a gRPC failure of the stream itself
        code = e.code().name if callable(getattr(e, "code", None)) else type(e).__name__
        details = e.details() if callable(getattr(e, "details", None)) else str(e)
        out = result("unexpected_error" if plan.kind != "bad" else "clean_error" if
                     re.search(rf"(^|, ){plan.error_field}: ", str(details)) else "unexpected_error",
                     f"{code}: {details}")
    finally:
        done.set()
    if plan.kind == "cancel_after_final":   # what a client closing its stream with cancel_requests=True does
        responses.cancel()
    elif out.outcome != "cancelled":
        try:  # the server closes the stream after its final response
            async def drain():
                async for _ in responses:
                    pass
            await asyncio.wait_for(drain(), 5.0)
        except Exception:
            responses.cancel()
    return out


# ---- the loop ---------------------------------------------------------------------------------------

def sample(report: Report, procs: dict[str, int], label: str, n: int) -> None:
    report.rss_mib.append(rss_sample(procs, label, n))
    report.fds.append(count_sample(procs, label, n, "fds"))
    report.threads.append(count_sample(procs, label, n, "threads"))


async def soak(url: str, plans: list[Plan], *, concurrency: int, timeout: float, model: str, warmup: int,
               procs: dict[str, int], rss_every: int, report: Report, progress: bool = True,
               gateway: str | None = None, via_gateway: frozenset[int] = frozenset()) -> tuple[list[Outcome], float]:
    import grpc
    import tritonclient.grpc.aio as grpcclient

    from triton_llm.v1 import llm_service_pb2_grpc as pb_grpc

    client = grpcclient.InferenceServerClient(url)
    channel = grpc.aio.insecure_channel(gateway) if gateway else None
    stub = pb_grpc.LLMServiceStub(channel) if channel is not None else None
    outcomes: list[Outcome] = []
    order = iter(plans)
    t0 = time.perf_counter()
    marks = {warmup: "after warm-up"} | {k: f"after {k}" for k in range(rss_every, len(plans), rss_every)}

    async def one(plan: Plan) -> Outcome:
        if stub is None or plan.index not in via_gateway:
            return await run_one(client, plan, model=model, timeout=timeout)
        t = time.perf_counter()
        outcome, seen, detail = await soak_gateway.run_one(stub, plan, timeout)
        return Outcome(plan.index, plan.kind + " (gateway)", outcome, time.perf_counter() - t, seen, detail[:300])

    async def worker():
        for plan in order:
            outcomes.append(await one(plan))
            n = len(outcomes)
            if n in marks and procs:
                sample(report, procs, marks[n], n)
            if progress and n % max(1, len(plans) // 20) == 0:
                bad = sum(o.outcome in ("unexpected_error", "hung", "lost") for o in outcomes)
                print(f"  {n}/{len(plans)} requests, {n / (time.perf_counter() - t0):.1f}/s, "
                      f"{bad} unexpected/hung/lost", flush=True)

    try:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    finally:
        await client.close()
        if channel is not None:
            await channel.close()
    return sorted(outcomes, key=lambda o: o.index), time.perf_counter() - t0


def summarize(outcomes: list[Outcome], report: Report) -> None:
    report.counts = {k: sum(o.outcome == k for o in outcomes) for k in OUTCOMES}
    report.counts["sent"] = len(outcomes)
    kinds = sorted({o.kind for o in outcomes})
    report.by_kind = {k: {o: sum(x.kind == k and x.outcome == o for x in outcomes) for o in OUTCOMES
                          if any(x.kind == k and x.outcome == o for x in outcomes)} for k in kinds}
    report.unexpected = [f"#{o.index} {o.kind}: {o.outcome}: {o.detail}" for o in outcomes
                         if o.outcome in ("unexpected_error", "hung", "lost")][:20]


def table(report: Report) -> str:
    c = report.counts
    lines = [f"sent {c['sent']}  completed {c['completed']}  cancelled {c['cancelled']}  clean errors "
             f"{c['clean_error']}  unexpected errors {c['unexpected_error']}  hung {c['hung']}  lost {c['lost']}",
             f"{report.requests_per_s:.1f} requests/s over {report.seconds:.0f} s; at idle afterwards: KV blocks "
             f"used {report.idle.get('kv_blocks_used')}, active requests {report.idle.get('active_requests')}"]
    if report.rss_mib:
        names = [k for k in report.rss_mib[0] if k not in ("at", "requests")]
        lines.append("RSS MiB  " + "  ".join(f"{n:>16}" for n in names))
        for s in report.rss_mib:
            lines.append(f"{s['at'][:16]:<16} " + "  ".join(
                f"{s[n]:>16.1f}" if s.get(n) is not None else f"{'-':>16}" for n in names))
    for title, samples in (("fds", report.fds), ("threads", report.threads)):
        if samples:
            names = [k for k in samples[0] if k not in ("at", "requests")]
            lines.append(f"{title:<16} " + "  ".join(f"{n:>16}" for n in names))
            for s in samples:
                lines.append(f"{s['at'][:16]:<16} " + "  ".join(f"{s.get(n) if s.get(n) is not None else '-':>16}"
                                                             for n in names))
    for what, changes in report.growth.items():
        lines.append(f"second half, {what}: " + ", ".join(f"{n} {v:+g}" if v is not None else f"{n} -"
                                                          for n, v in changes.items()))
    if report.shutdown:
        lines.append(f"shutdown: {report.shutdown}")
    for u in report.unexpected[:5]:
        lines.append("  " + u)
    return "\n".join(lines)


def start_gateway(url: str, log_dir: Path):
    """``python -m gateway`` in front of the server at ``url``, SERVING."""
    from cli.gateway_process import GatewayProcess
    from cli.launcher import free_port

    log_dir.mkdir(parents=True, exist_ok=True)
    return GatewayProcess(f"127.0.0.1:{free_port()}", url,            # the OpenAI API stays off (the default)
                          log_path=log_dir / "soak-gateway.log").start_ready()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="gRPC endpoint of a running server; default: start one (the shipped config)")
    ap.add_argument("--metrics-url", help="its metrics endpoint (default: the started server's)")
    ap.add_argument("--set", action="append", default=[], metavar="MODEL.KEY=VALUE",
                    help="config.pbtxt override for the started server (repeatable)")
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--cancel-share", type=float, default=0.2, help="requests the client cancels mid-stream")
    ap.add_argument("--bad-share", type=float, default=0.08, help="requests with a bad input")
    ap.add_argument("--sampled-share", type=float, default=0.5, help="of the good requests, sampled (rest greedy)")
    ap.add_argument("--cancel-after-final-share", type=float, default=0.0,
                    help="of the good requests, cancel the stream after the final response (a diagnostic: "
                         "Triton 2.51 may then keep the ensemble live)")
    ap.add_argument("--triton-rejected-share", type=float, default=0.0,
                    help="requests Triton itself rejects (INT64 max_tokens, an unknown input); they keep Triton "
                         "2.51's ensemble live until shutdown")
    ap.add_argument("--max-tokens", default="8,64", help="max_tokens range (default 8,64)")
    ap.add_argument("--warmup", type=int, default=200, help="requests before the 'after warm-up' RSS sample")
    ap.add_argument("--rss-every", type=int, default=1000, help="an RSS sample every this many requests")
    ap.add_argument("--request-timeout", type=float, default=120.0, help="a request with nothing final by then hangs")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", default="ensemble")
    ap.add_argument("--gateway", action="store_true", help="also start a gateway; send a share of requests through it")
    ap.add_argument("--gateway-share", type=float, default=0.5, help="with --gateway: requests sent through it")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "soak.json")
    args = ap.parse_args(argv)
    lo, hi = (int(x) for x in args.max_tokens.split(","))
    plans = make_plans(args.requests, seed=args.seed, cancel_share=args.cancel_share, bad_share=args.bad_share,
                       sampled_share=args.sampled_share, max_tokens=(lo, hi),
                       triton_rejected_share=args.triton_rejected_share,
                       cancel_after_final_share=args.cancel_after_final_share)
    report = Report(config={k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()})

    def body(url: str, server) -> Report:
        metrics_url = args.metrics_url or (server.metrics_url if server is not None else None)
        pid = server.proc.pid if server is not None else find_server_pid(int(url.rsplit(":", 1)[1]))
        procs = server_processes(pid) if pid else {}
        gw = start_gateway(url, args.out.parent) if args.gateway else None
        try:
            if gw is not None:
                procs["gateway"] = gw.proc.pid
            if not procs:
                print("(tritonserver not found on this machine: no RSS samples)", flush=True)
            else:
                sample(report, procs, "start", 0)
            rng = random.Random(args.seed + 1)
            via = frozenset(p.index for p in plans if rng.random() < args.gateway_share
                            and soak_gateway.generate_request(p) is not None) if gw is not None else frozenset()
            print(f"soak: {len(plans)} requests at concurrency {args.concurrency} against {url}"
                  f"{f' ({len(via)} through the gateway at {gw.target})' if gw else ''} ...", flush=True)
            outcomes, seconds = asyncio.run(soak(
                url, plans, concurrency=args.concurrency, timeout=args.request_timeout, model=args.model,
                warmup=min(args.warmup, len(plans)), procs=procs, rss_every=args.rss_every, report=report,
                gateway=gw.target if gw else None, via_gateway=via))
            report.seconds, report.requests_per_s = seconds, len(outcomes) / seconds
            report.idle = wait_idle(metrics_url)
            if procs:
                sample(report, procs, "end (idle)", len(outcomes))
                report.growth = {"rss_pct": second_half_growth(report.rss_mib, percent=True),
                                 "fds": second_half_growth(report.fds, percent=False),
                                 "threads": second_half_growth(report.threads, percent=False)}
        finally:
            if gw is not None:
                gw.stop()
        summarize(outcomes, report)
        return report

    if args.url:
        body(args.url, None)
    else:
        from bench.harness.server import repository_overrides, run_with_server
        from cli.launcher import TritonServer

        stop_info: dict[str, Any] = {}
        original_stop = TritonServer.stop

        def timed_stop(self, timeout: float = 30.0):
            t0 = time.monotonic()
            code = original_stop(self, timeout)
            stop_info.update(seconds=round(time.monotonic() - t0, 1), exit_code=code)
            return code

        TritonServer.stop = timed_stop
        try:
            if run_with_server(body, repository_overrides(None, args.set), url=None, out=args.out.parent,
                               name="soak", server_timeout=300) is None:
                return 1
        finally:
            TritonServer.stop = original_stop
        report.shutdown = stop_info
    print(table(report))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(asdict(report), indent=1) + "\n")
    print(f"written: {args.out}")
    c = report.counts
    return 0 if c["hung"] == 0 and c["lost"] == 0 and c["unexpected_error"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
