"""Pipeline benchmark: the Triton ensemble over gRPC streaming vs the in-process engine, same workload, one run.

    python -m bench.bench_pipeline                     # starts tritonserver itself (free ports)
    python -m bench.bench_pipeline --model /path/ckpt  # another checkpoint (server and in-process)
    python -m bench.bench_pipeline --url 127.0.0.1:8001   # an already-running server
    python -m bench.bench_pipeline --quick             # fewer, shorter requests (smoke run)

A closed-loop load generator (``tritonclient.grpc.aio``, one ``stream_infer`` stream per request,
``concurrency`` requests in flight) sends seeded prompts cut from held-out code to the ``ensemble``
with TensorRT-LLM's input names: ``text_input``, ``max_tokens``, ``stream=true``, ``temperature=0``,
``exclude_input_in_output=true``, ``min_tokens=max_tokens`` (the API's ignore-EOS equivalent: EOS is
banned until ``max_tokens`` are out, so every request produces exactly ``max_tokens``) and
``return_num_output_tokens=true`` (tokens are counted from it, never from the text).

The same requests then run through ``LLMEngine`` in this process, built with the same EngineConfig as
the server's ``llm`` model (``model_repository/llm/config.pbtxt`` plus the same overrides). Prompt ids
and SamplingParams come from running preprocess's own ``RequestParser`` on the same inputs, so both
sides see token-identical prompts. The two sides alternate within each level (halves in the order
pipeline, in-process, in-process, pipeline where half the requests still fill the concurrency), so a
drifting background load hits both alike.

Per request: TTFT, inter-token latency (gap between streamed responses / tokens in the later one),
TPOT ((last token - first token) / (tokens - 1)), end-to-end latency. Per level: output tokens/s,
p50/p90/p99. Ratios: pipeline TPOT p50 at concurrency 1 / in-process (goal <= 1.10) and pipeline
tokens/s at 32 concurrent / in-process (goal >= 0.85). Writes bench/results/pipeline.json and
bench/results/pipeline.png. Bounded: each level takes no new requests after --level-seconds, each
request is cut at --request-timeout, the sweep skips remaining levels after --max-seconds; a server
started here is always stopped (also on Ctrl-C / SIGTERM).
"""
from __future__ import annotations

import argparse
import asyncio
import functools
import os
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

from bench.harness.closed_loop import clock, engine_runner, pipeline_runner, run_level, sweep
from bench.harness.loop_time import as_dict, describe, scrape_loop_seconds
from bench.harness.report import ENGINE, PIPELINE, Comparison, git_commit, machine, print_load, write_json
from bench.harness.server import LauncherError, check_alive, engine_config, repository_overrides, run_with_server
from bench.harness.workload import make_workload, request_values, requests_for

LEVELS = (1, 4, 8, 16, 32)
GOAL_TPOT_RATIO = 1.10      # pipeline TPOT at concurrency 1 / in-process, at most
GOAL_THROUGHPUT_RATIO = 0.85  # pipeline tokens/s at 32 concurrent / in-process, at least
LOOP_SETTLE_S = 1.5           # idle wait before reading the llm model's loop seconds (published every 1 s by default)
COMPARISON = Comparison(PIPELINE, ENGINE, tpot_goal_max=GOAL_TPOT_RATIO, throughput_goal_min=GOAL_THROUGHPUT_RATIO)


async def measure(args, url: str, cfg, workloads: dict[int, list], deadline: float, server=None,
                  loop: dict | None = None) -> list[dict]:
    """Warm-up, then one row per level: the ensemble at ``url`` vs an in-process LLMEngine built from ``cfg``.
    ``loop`` (if given) gets each side's engine loop thread time over the whole run (``bench/harness/loop_time.py``)."""
    import tritonclient.grpc.aio as grpcclient

    from backend.engine.llm_engine import LLMEngine

    engine = None if args.skip_engine else LLMEngine(cfg).start()
    client = grpcclient.InferenceServerClient(url)
    try:
        if not await client.is_model_ready(args.triton_model):
            raise LauncherError(f"model {args.triton_model!r} is not ready at {url}")
        runners = {"pipeline": pipeline_runner(client, model=args.triton_model, request_timeout=args.request_timeout)}
        if engine is not None:
            runners["engine"] = engine_runner(engine, request_timeout=args.request_timeout)
        # Warm-up (not measured): one short request per side, a prompt outside the workload.
        warm = make_workload(Path(cfg.model.model_path), 1, args.seed - 1, args.prompt_range, (8, 8))
        await run_level(runners, warm, 1, level_seconds=60)
        runners["pipeline"] = _stop_if_died(runners["pipeline"], server)
        print(COMPARISON.header(), flush=True)
        rows = await sweep(workloads, runners, level_seconds=args.level_seconds, deadline=deadline,
                           annotate=functools.partial(check_outputs, cfg.model.model_path), show=COMPARISON.print_level)
        if loop is not None:
            await record_loop_time(loop, engine, server)
        return rows
    finally:
        await client.close()
        if engine is not None:
            engine.shutdown()


async def record_loop_time(loop: dict, engine, server) -> None:
    """Each side's engine loop thread: busy seconds split into CPU, run queue and blocked (mostly the GIL)."""
    loop["in_process"] = engine.stats().loop if engine is not None else None
    loop["pipeline"] = None
    if server is not None:   # a server of ours: its metrics port is known
        await asyncio.sleep(LOOP_SETTLE_S)
        try:
            loop["pipeline"] = await asyncio.to_thread(scrape_loop_seconds, server.metrics_url)
        except OSError as e:
            print(f"(could not read the llm model's loop seconds: {e})", flush=True)
    for side in ("pipeline", "in_process"):
        print(f"engine loop thread, {side.replace('_', '-')} (whole run): {describe(loop[side])}", flush=True)


def _stop_if_died(run, server):
    """``run``, then ``ServerDied`` if the server started by this run has exited meanwhile."""
    async def checked(items, concurrency, level_seconds):
        got = await run(items, concurrency, level_seconds)
        check_alive(server, f"concurrency {concurrency}")
        return got
    return checked


def check_outputs(model_path: str, row: dict, run, items) -> None:
    """Prompt lengths the server saw vs preprocess's parser; greedy outputs identical on both sides."""
    row["pipeline"]["num_input_tokens_match"] = sum(
        r is not None and r.num_input_tokens == len(it.prompt_ids) for r, it in zip(run.records["pipeline"], items))
    if "engine" in run.records:
        # Greedy on both sides: same prompt ids -> normally the same text (batching may flip near-ties).
        tok = _detokenizer(model_path)
        row["identical_outputs"] = sum(
            1 for p, e in zip(run.records["pipeline"], run.records["engine"])
            if p and e and p.error is None and e.error is None and p.text == tok.decode(e.token_ids))


@functools.lru_cache(maxsize=4)
def _detokenizer(model_path: str):
    from preprocess import load_tokenizer
    return load_tokenizer(model_path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, help="checkpoint folder for server and in-process engine "
                    "(default: model_path of model_repository/llm/config.pbtxt)")
    ap.add_argument("--url", help="gRPC endpoint of a running server (e.g. 127.0.0.1:8001); default: start one")
    ap.add_argument("--set", action="append", default=[], metavar="MODEL.KEY=VALUE",
                    help="config.pbtxt parameter override for the started server and the in-process engine")
    ap.add_argument("--levels", default=",".join(map(str, LEVELS)), help="concurrency levels (default 1,4,8,16,32)")
    ap.add_argument("--min-requests", type=int, default=8, help="requests per level, at least (default 8)")
    ap.add_argument("--max-requests", type=int, default=48, help="requests per level, at most (default 48)")
    ap.add_argument("--prompt-tokens", default="32,256", help="prompt length range in tokens (default 32,256)")
    ap.add_argument("--output-tokens", default="32,128", help="max_tokens range (default 32,128)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="smoke run: 4..16 requests per level, short outputs")
    ap.add_argument("--skip-engine", action="store_true", help="pipeline only (no in-process comparison)")
    ap.add_argument("--level-seconds", type=float, default=90.0, help="no new requests after this (per level)")
    ap.add_argument("--request-timeout", type=float, default=120.0)
    ap.add_argument("--max-seconds", type=float, default=900.0, help="skip remaining levels after this")
    ap.add_argument("--server-timeout", type=float, default=300.0, help="seconds to wait for the server to be ready")
    ap.add_argument("--triton-model", default="ensemble")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    ap.add_argument("--note", default="", help="free text stored in the JSON (e.g. the machine's conditions)")
    args = ap.parse_args(argv)
    args.levels = [int(x) for x in args.levels.split(",") if x.strip()]
    if not args.levels or min(args.levels) < 1:
        ap.error("--levels: positive integers")
    prompt_range = tuple(int(x) for x in args.prompt_tokens.split(","))
    output_range = tuple(int(x) for x in args.output_tokens.split(","))
    if args.quick:
        args.min_requests, args.max_requests = 4, 16
        output_range = (16, 48)
    args.prompt_range, args.output_range = prompt_range, output_range

    try:
        overrides = repository_overrides(args.model.resolve() if args.model else None, args.set)
        cfg, engine_params = engine_config(overrides)
    except (LauncherError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    model = Path(cfg.model.model_path)
    if not (model / "config.json").is_file() or not any(model.glob("*.safetensors")):
        print(f"error: {model} has no checkpoint (config.json + *.safetensors); train the demo model "
              "(tools/train_demo.sh) or pass --model", file=sys.stderr)
        return 2

    print(f"model: {model}\nworkload: prompts {prompt_range} tokens, max_tokens {output_range}, seed {args.seed}",
          flush=True)
    workloads = {c: make_workload(model, requests_for(c, args.min_requests, args.max_requests), args.seed + c,
                                  prompt_range, output_range) for c in args.levels}
    start_wall = clock()
    deadline = start_wall + args.max_seconds
    load_before = os.getloadavg()
    loop: dict = {}

    def body(url: str, server) -> list[dict]:
        print(f"pipeline: {url} model '{args.triton_model}'; in-process: LLMEngine with the llm config "
              f"({', '.join(f'{k}={v}' for k, v in sorted(engine_params.items()) if k != 'model_path')})", flush=True)
        return asyncio.run(measure(args, url, cfg, workloads, deadline, server, loop))

    levels = run_with_server(body, overrides, url=args.url, out=args.out, name="pipeline",
                             server_timeout=args.server_timeout)
    if levels is None:
        return 1

    result: dict[str, Any] = {
        "levels": levels, "ratios": COMPARISON.ratios(levels),
        "workload": {"seed": args.seed, "prompt_tokens": prompt_range, "output_tokens": output_range,
                     "requests_per_level": {c: len(workloads[c]) for c in args.levels},
                     "options": {k: v for k, v in request_values("", 0).items() if k != "text_input"} |
                     {"max_tokens": "per request", "min_tokens": "= max_tokens"}},
        "engine_config": engine_params, "url": args.url or "started by this run",
        "engine_loop_seconds": {side: as_dict(t) for side, t in loop.items()},
        "machine": machine(load_before, args.note),
        "commit": git_commit(), "seconds": clock() - start_wall,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    COMPARISON.print_ratios(result["ratios"])
    print_load(result["machine"], result["seconds"])
    write_json(args.out / "pipeline.json", result)
    COMPARISON.plot(levels, args.out / "pipeline.png")
    print(f"wrote {args.out / 'pipeline.json'} and {args.out / 'pipeline.png'}")
    return 0 if levels else 1


if __name__ == "__main__":
    sys.exit(main())
