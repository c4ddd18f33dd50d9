"""Gateway benchmark: the typed API through the gateway vs the ensemble directly, same workload, one run;
with ``--api openai``, the OpenAI-compatible HTTP API vs the typed gRPC API (the same gateway process).

    python -m bench.bench_gateway            # starts tritonserver and the gateway itself
    python -m bench.bench_gateway --quick    # fewer requests (smoke run)
    python -m bench.bench_gateway --api openai   # /v1/completions streamed (SSE) vs gRPC Generate

Both sides talk to the same tritonserver (the shipped model repository with prefix caching off, since
both sides send the same prompts back to back; free ports): "direct" is the
closed-loop gRPC client of bench/harness/closed_loop.py (``tritonclient.grpc.aio``, one ``stream_infer``
per request to ``ensemble``); "gateway" sends the same requests as ``triton_llm.v1.GenerateRequest``
to ``python -m gateway`` (its own process, as deployed), over grpcio's asyncio client. Requests are
greedy with ``min_tokens = max_tokens`` (exactly ``max_tokens`` tokens each), ``stream=true``,
``exclude_input_in_output=true``; tokens are counted from the cumulative ``num_output_tokens``.

Two levels: concurrency 1 (TPOT: (last token - first token) / (tokens - 1), p50 over requests) and 32
streams (output tokens/s over each side's wall time). Both sides run the same requests, one request
(concurrency 1) or one wave of 32 at a time, the order alternating (direct then gateway, gateway then
direct, ...), so load from elsewhere on a shared machine hits both sides alike.
Goals: gateway TPOT at concurrency 1 <= 1.05x direct; gateway throughput at 32 >= 0.95x direct, judged
on the medians of paired ratios (each request's, each wave's, gateway over direct run back to back);
the ratios of the totals are printed too. ``--api openai``: the sides are "gateway" (baseline) and
"openai" (bench/harness/openai_client.py), goals 1.10x and 0.90x.
Writes bench/results/gateway.json (``--api openai``: openai.json). Run it on an otherwise idle machine.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

from bench.harness.closed_loop import pipeline_request
from bench.harness.stats import RequestRecord, percentile, request_metrics, summarize
from bench.harness.workload import WorkItem, make_workload
from cli.launcher import (
    CACHE,
    MODEL_REPOSITORY,
    LauncherError,
    Ports,
    TritonServer,
    free_port,
    render_model_repository,
)

# --api -> (baseline, candidate, TPOT p50 ratio at concurrency 1 at most, tokens/s ratio at 32 streams at least)
GOALS = {"grpc": ("direct", "gateway", 1.05, 0.95), "openai": ("gateway", "openai", 1.10, 0.90)}
clock = time.perf_counter


async def gateway_request(stub, item: WorkItem, *, timeout: float) -> RequestRecord:
    """One request through the gateway, recorded like bench_pipeline's direct requests."""
    import grpc

    from triton_llm.v1 import llm_service_pb2 as pb

    req = pb.GenerateRequest(prompt=item.text, max_tokens=item.max_tokens, min_tokens=item.max_tokens,
                             temperature=0.0, stream=True, exclude_input_in_output=True)
    record = RequestRecord(start=clock())
    seen = 0
    try:
        async for msg in stub.Generate(req, timeout=timeout):
            t = clock()
            if msg.num_output_tokens > seen:
                record.events.append((t, msg.num_output_tokens - seen))
                seen = msg.num_output_tokens
            record.text += msg.text
            if msg.HasField("usage"):
                record.num_input_tokens = msg.usage.prompt_tokens
                record.finish_reason = pb.FinishReason.Name(msg.finish_reason)
                record.end = t
    except grpc.aio.AioRpcError as e:
        record.error = f"{e.code().name}: {e.details()}"
    if record.end is None:
        record.end = clock()
        record.error = record.error or "stream ended without usage"
    return record


async def closed_loop(items: list[WorkItem], concurrency: int, one) -> tuple[list[RequestRecord], float]:
    records: list[RequestRecord | None] = [None] * len(items)
    order = iter(range(len(items)))
    t0 = clock()

    async def worker():
        for i in order:
            records[i] = await one(items[i])

    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(items)))))
    return [r for r in records if r is not None], clock() - t0


async def run_level(items: list[WorkItem], concurrency: int, sides: dict, segment: int) -> dict[str, Any]:
    """Both ``sides`` (name -> request function; the first is the baseline) on the same items, ``segment``
    items at a time, the order alternating per segment, so load from elsewhere hits both sides alike.

    Besides each side's totals, the row has paired ratios (candidate / baseline), taken where both sides
    ran back to back: per request TPOT, and per segment tokens/s; their medians shrug off a burst of
    load that hit one side of one pair."""
    base, cand = list(sides)
    recs: dict[str, list] = {base: [None] * len(items), cand: [None] * len(items)}
    secs = {base: 0.0, cand: 0.0}
    seg_tput: list[float] = []
    for k, lo in enumerate(range(0, len(items), segment)):
        hi = min(lo + segment, len(items))
        rate = {}
        for side in ((base, cand) if k % 2 == 0 else (cand, base)):
            got, dt = await closed_loop(items[lo:hi], concurrency, sides[side])
            recs[side][lo:hi] = got
            secs[side] += dt
            rate[side] = sum(r.tokens for r in got) / dt if dt > 0 else 0.0
        if rate[base] > 0:
            seg_tput.append(rate[cand] / rate[base])
    row: dict[str, Any] = {"concurrency": concurrency, "requests": len(items), "segment": segment}
    for side in (base, cand):
        row[side] = summarize([r for r in recs[side] if r is not None], secs[side])
    row["identical_text"] = sum(1 for d, g in zip(recs[base], recs[cand])
                                if d and g and d.error is None and g.error is None and d.text == g.text)
    tpot_pairs = []
    for d, g in zip(recs[base], recs[cand]):
        if d and g and d.error is None and g.error is None:
            td, tg = request_metrics(d)["tpot"], request_metrics(g)["tpot"]
            if td and tg:
                tpot_pairs.append(tg / td)
    row["paired_tpot_ratio_p50"] = percentile(tpot_pairs, 50) if tpot_pairs else None
    row["paired_throughput_ratio_p50"] = percentile(seg_tput, 50) if seg_tput else None
    row["segment_throughput_ratios"] = seg_tput
    return row


def _line(side: str, s: dict) -> str:
    tpot, ttft = s["tpot_ms"], s["ttft_ms"]
    fmt = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
    return (f"  {side:8s} {s['completed']:3d}/{s['requests']:<3d} req  {s['tok_per_s'] or 0:8.1f} tok/s  "
            f"TPOT p50 {fmt(tpot['p50'])} ms (mean {fmt(tpot['mean'])})  TTFT p50 {fmt(ttft['p50'])} ms  "
            f"errors {s['errors']}")


async def bench(args, triton_url: str, gateway_target: str, model: Path, openai_url: str | None = None
                ) -> dict[str, Any]:
    import grpc
    import httpx
    import tritonclient.grpc.aio as grpcclient

    from bench.harness.openai_client import openai_request
    from triton_llm.v1 import llm_service_pb2_grpc as pb_grpc

    client = grpcclient.InferenceServerClient(triton_url)
    channel = grpc.aio.insecure_channel(gateway_target)
    stub = pb_grpc.LLMServiceStub(channel)
    http = httpx.AsyncClient(limits=httpx.Limits(max_connections=64, max_keepalive_connections=64))

    async def direct(item):
        return await pipeline_request(client, item, model="ensemble", timeout=args.request_timeout)

    async def gateway(item):
        return await gateway_request(stub, item, timeout=args.request_timeout)

    async def openai(item):
        return await openai_request(http, openai_url, model.name, item, timeout=args.request_timeout)

    base, cand, _, _ = GOALS[args.api]
    fns = {"direct": direct, "gateway": gateway, "openai": openai}
    sides = {base: fns[base], cand: fns[cand]}

    def fixed(items: list[WorkItem], max_tokens: int) -> list[WorkItem]:
        return [WorkItem(w.text, max_tokens, w.prompt_ids, w.params) for w in items]

    try:
        warm = fixed(make_workload(model, 4, args.seed - 1, (32, 64), (8, 8)), 8)
        for fn in sides.values():
            await closed_loop(warm, 2, fn)
        levels = []
        for concurrency, n in ((1, args.requests_1), (32, args.requests_32)):
            items = fixed(make_workload(model, n, args.seed + concurrency, (32, 256), (16, 16)), args.max_tokens)
            row = await run_level(items, concurrency, sides, segment=1 if concurrency == 1 else 32)
            levels.append(row)
            print(f"concurrency {concurrency} ({n} requests of {args.max_tokens} tokens, "
                  f"identical text {row['identical_text']}/{n}):", flush=True)
            for side in sides:
                print(_line(side, row[side]), flush=True)
    finally:
        await http.aclose()
        await channel.close()
        await client.close()
    one, many = levels
    tpot = (one[cand]["tpot_ms"]["p50"] or 0) / (one[base]["tpot_ms"]["p50"] or float("nan"))
    tput = (many[cand]["tok_per_s"] or 0) / (many[base]["tok_per_s"] or float("nan"))
    return {"levels": levels, "tpot_ratio_c1": tpot, "throughput_ratio_c32": tput,
            "paired_tpot_ratio_c1": one["paired_tpot_ratio_p50"],
            "paired_throughput_ratio_c32": many["paired_throughput_ratio_p50"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests-1", type=int, default=48, help="requests at concurrency 1 (default 48)")
    ap.add_argument("--requests-32", type=int, default=512, help="requests at 32 streams (default 512: 16 waves)")
    ap.add_argument("--max-tokens", type=int, default=64, help="tokens per request (default 64)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="smoke run: 4 and 32 requests of 16 tokens")
    ap.add_argument("--request-timeout", type=float, default=120.0)
    ap.add_argument("--api", choices=sorted(GOALS), default="grpc",
                    help="grpc: the gateway vs the ensemble directly (default); openai: the HTTP API vs the gateway's gRPC")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = ap.parse_args(argv)
    if args.quick:
        args.requests_1, args.requests_32, args.max_tokens = 4, 32, 16
    model = REPO / "models" / "demo-target"
    load_before = os.getloadavg()
    print(f"load average before: {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f} "
          f"({os.cpu_count()} CPUs)", flush=True)

    from cli.gateway_process import GatewayProcess

    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="bench_gateway.", dir=CACHE))
    # Both sides send the same prompts back to back: without this the second would hit the prefix cache.
    repo = render_model_repository(tmp / "model_repository", {"llm": {"enable_prefix_caching": "false"}},
                                   src=MODEL_REPOSITORY)
    server = TritonServer(repo, Ports.free(), log_path=tmp / "server.log", extra_args=[
        "--exit-timeout-secs=10", "--http-address=127.0.0.1", "--grpc-address=127.0.0.1",
        "--metrics-address=127.0.0.1"])
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    gw = GatewayProcess(f"127.0.0.1:{free_port()}", f"127.0.0.1:{server.ports.grpc}", env=env,
                        log_path=tmp / "gateway.log",
                        openai_listen=f"127.0.0.1:{free_port()}" if args.api == "openai" else None)
    try:
        server.start()
        server.wait_ready(timeout=300)
        gw.start()
        gw.wait_ready(timeout=60)
        result = asyncio.run(bench(args, f"127.0.0.1:{server.ports.grpc}", gw.target, model, gw.openai_url))
    except LauncherError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        gw.stop()
        server.stop()
    load_after = os.getloadavg()
    base, cand, goal_tpot, goal_tput = GOALS[args.api]
    result.update(load_before=load_before, load_after=load_after, max_tokens=args.max_tokens, api=args.api,
                  goals={"tpot_ratio_c1_max": goal_tpot, "throughput_ratio_c32_min": goal_tput})
    ok_tpot = result["paired_tpot_ratio_c1"] <= goal_tpot
    ok_tput = result["paired_throughput_ratio_c32"] >= goal_tput
    print(f"\n{cand} / {base} TPOT, concurrency 1: {result['paired_tpot_ratio_c1']:.3f} median of per-request "
          f"pairs, {result['tpot_ratio_c1']:.3f} of the p50s (goal <= {goal_tpot}: "
          f"{'met' if ok_tpot else 'NOT met'})")
    print(f"{cand} / {base} output tokens/s, 32 streams: {result['paired_throughput_ratio_c32']:.3f} median of "
          f"per-wave pairs, {result['throughput_ratio_c32']:.3f} overall (goal >= {goal_tput}: "
          f"{'met' if ok_tput else 'NOT met'})")
    print(f"load average after: {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}")
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / ("gateway.json" if args.api == "grpc" else f"{args.api}.json")
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
