"""What tracing costs: pipeline throughput at 32 concurrent streams with tracing off and on (100% sampled).

    python -m bench.bench_tracing                   # off, on, on, off ... (--repeats pairs)
    python -m bench.bench_tracing --quick           # a short smoke run

One tritonserver per mode (model_repository/, CPU, the demo model) runs for the whole benchmark; after a
warm-up, load goes to one server at a time in windows of ``--seconds``, alternating (off, on, on, off, ...),
so a drifting background load hits every mode alike. A window keeps ``--streams`` requests in flight
(closed loop, one gRPC stream per request, ``temperature=0``, ``min_tokens=max_tokens`` so every request
makes exactly ``--max-tokens`` tokens) and counts the output tokens the responses report, and the CPU
time the server's processes used (tritonserver and its model stubs) per token. "on" sets
OTEL_EXPORTER_OTLP_ENDPOINT (sampler always_on) at a collector in a separate process that reads and
discards every export, so what is measured is the serving side's cost: Triton's OpenTelemetry mode,
the models' span creation and their exporters; "triton" gives only tritonserver the trace flags;
"base" (with ``--baseline DIR``, a checkout without the always-on request histograms and log line)
serves that checkout's code, to measure what they cost. The
histograms and the request log are on in every mode. Result: the ratio of median tokens/s, on / off
(goal >= 0.95), and of median server CPU per token. The load average is printed with each window: on a
shared machine, repeat when it was high.
Writes bench/results/tracing.json.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

from cli import launcher as launcher
from cli.client import OUTPUTS, build_inputs, parse_result
from cli.launcher import Ports, TritonServer, free_port, render_model_repository

# A collector that reads every OTLP/HTTP export and throws it away (counts requests and bytes).
SINK = r"""
import http.server, sys, json, threading
stats = {"posts": 0, "bytes": 0}
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0); self.rfile.read(n)
        stats["posts"] += 1; stats["bytes"] += n
        self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
    def do_GET(self):
        body = json.dumps(stats).encode(); self.send_response(200)
        self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""

PROMPTS = [f"def handler_{i}(request, *args):\n    \"\"\"Handle request number {i}.\"\"\"\n    data = request.get('{i}')\n"
           for i in range(64)]


def tree_cpu_seconds(root_pid: int) -> float:
    """User + system CPU seconds of a process and its live descendants (tritonserver and its model stubs)."""
    procs = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            procs[int(d.name)] = (int(fields[1]), int(fields[11]) + int(fields[12]))   # ppid, utime + stime
    tree, frontier = {root_pid}, [root_pid]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, _) in procs.items():
            if ppid == parent and pid not in tree:
                tree.add(pid)
                frontier.append(pid)
    return sum(procs[p][1] for p in tree if p in procs) / os.sysconf("SC_CLK_TCK")


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


async def closed_loop(url: str, streams: int, seconds: float, max_tokens: int) -> dict:
    import tritonclient.grpc.aio as aioclient
    from tritonclient.grpc import InferRequestedOutput

    client = aioclient.InferenceServerClient(url)
    outputs = [InferRequestedOutput(o) for o in OUTPUTS]
    tokens, requests, errors = 0, 0, 0
    deadline = time.perf_counter() + seconds

    async def one(prompt: str) -> int:
        async def gen():
            yield {"model_name": "ensemble", "inputs": build_inputs(
                prompt, max_tokens, temperature=0.0, min_tokens=max_tokens, stream=True,
                exclude_input_in_output=True, return_num_output_tokens=True),
                "outputs": outputs, "request_id": uuid.uuid4().hex, "enable_empty_final_response": True}
        n = 0
        async for result, error in client.stream_infer(inputs_iterator=gen()):
            if error is not None:
                raise RuntimeError(str(error))
            chunk = parse_result(result)
            n = max(n, chunk.num_output_tokens)
            if chunk.final:
                break
        return n

    async def worker(k: int) -> None:
        nonlocal tokens, requests, errors
        i = k
        while time.perf_counter() < deadline:
            try:
                n = await one(PROMPTS[i % len(PROMPTS)])   # not `tokens += await ...`: that reads tokens first
                tokens += n
                requests += 1
            except Exception:
                errors += 1
            i += streams

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(k) for k in range(streams)))
    elapsed = time.perf_counter() - t0
    await client.close()
    return {"tokens": tokens, "requests": requests, "errors": errors, "seconds": elapsed,
            "tokens_per_s": tokens / elapsed}


def start_server(mode: str, args, sink_port: int, root: Path) -> TritonServer:
    """mode: off; on (tritonserver and the models trace); triton (tritonserver's spans only, to split the cost)."""
    env, extra = {}, []
    otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{sink_port}", "OTEL_TRACES_SAMPLER": "always_on",
            "OTEL_SERVICE_NAME": "bench"}
    if mode == "on":
        env = otel
    elif mode == "triton":
        from tracing import TracingSettings

        extra = TracingSettings.from_env(otel).triton_args()
    overrides = {"llm": {"device": "cpu", "kv_cache_bytes": args.kv_cache_bytes, "max_num_seqs": "64"}}
    if args.model:
        overrides["llm"]["model_path"] = args.model
        overrides["preprocess"] = {"tokenizer_path": args.model}
        overrides["postprocess"] = {"tokenizer_path": args.model}
    code = Path(args.baseline).resolve() if mode == "base" else REPO
    repo = render_model_repository(root / f"repo-{mode}", overrides, src=code / "model_repository")
    srv = TritonServer(repo, Ports.free(), log_path=root / f"server-{mode}.log", extra_args=extra, env=env)
    saved, launcher.REPO = launcher.REPO, code   # the model stubs import the code of their working directory
    try:
        srv.start()
    finally:
        launcher.REPO = saved
    try:
        srv.wait_ready(timeout=300)
    except BaseException:
        srv.stop()
        raise
    return srv


def window(mode: str, srv: TritonServer, args) -> dict:
    load_before, cpu_before = loadavg(), tree_cpu_seconds(srv.proc.pid)
    result = asyncio.run(closed_loop(srv.grpc_url, args.streams, args.seconds, args.max_tokens))
    cpu = tree_cpu_seconds(srv.proc.pid) - cpu_before
    result.update(mode=mode, load_before=load_before, load_after=loadavg(), server_cpu_s=cpu,
                  server_cpu_ms_per_token=1000 * cpu / max(1, result["tokens"]))
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=15.0, help="length of one measured window")
    ap.add_argument("--warmup-seconds", type=float, default=5.0)
    ap.add_argument("--repeats", type=int, default=4, help="rounds of windows (off/on, then on/off, ...)")
    ap.add_argument("--modes", default="off,on",
                    help="off,on (default); triton: tritonserver's spans only; base: the --baseline checkout")
    ap.add_argument("--baseline", help="a checkout without this telemetry, served as mode 'base'")
    ap.add_argument("--kv-cache-bytes", default="64MiB")
    ap.add_argument("--model", help="another checkpoint (default: the repository's llm config)")
    ap.add_argument("--quick", action="store_true", help="8 streams, 16 tokens, 5 s runs, one pair")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "tracing.json")
    args = ap.parse_args(argv)
    if args.quick:
        args.streams, args.max_tokens, args.seconds, args.warmup_seconds, args.repeats = 8, 16, 4.0, 2.0, 1
    sink_port = free_port()
    sink = subprocess.Popen([sys.executable, "-c", SINK, str(sink_port)])
    runs, servers = [], {}
    tmp = Path(tempfile.mkdtemp(prefix="bench-tracing-"))
    try:
        modes = [m.strip() for m in args.modes.split(",") if m.strip()]
        for mode in modes:
            servers[mode] = start_server(mode, args, sink_port, tmp)
            asyncio.run(closed_loop(servers[mode].grpc_url, args.streams, args.warmup_seconds, args.max_tokens))
        for r in range(args.repeats):
            for mode in (modes if r % 2 == 0 else modes[::-1]):
                res = window(mode, servers[mode], args)
                runs.append(res)
                print(f"{mode:>6}: {res['tokens_per_s']:8.1f} tokens/s  {res['requests']:5d} requests "
                          f"{res['errors']} errors  server CPU {res['server_cpu_ms_per_token']:.3f} ms/token  "
                          f"load {res['load_before']} -> {res['load_after']}", flush=True)
        import urllib.request
        sink_stats = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{sink_port}/", timeout=5).read())
    finally:
        telemetry_cpu = {}
        for mode, srv in servers.items():
            srv.stop()
            lines = [x for x in srv.log_tail(400).splitlines() if x.startswith("telemetry: ")]
            telemetry_cpu[mode] = lines[-1] if lines else None
        shutil.rmtree(tmp, ignore_errors=True)
        sink.terminate()
        sink.wait(10)
    off = [r["tokens_per_s"] for r in runs if r["mode"] == "off"]
    on = [r["tokens_per_s"] for r in runs if r["mode"] == "on"]
    triton = [r["tokens_per_s"] for r in runs if r["mode"] == "triton"]
    base = [r["tokens_per_s"] for r in runs if r["mode"] == "base"]
    ratio = statistics.median(on) / statistics.median(off) if on and off else None
    cpu = {m: [r["server_cpu_ms_per_token"] for r in runs if r["mode"] == m] for m in ("off", "on", "triton", "base")}
    summary = {"streams": args.streams, "max_tokens": args.max_tokens, "seconds": args.seconds,
               "off_tokens_per_s": off, "on_tokens_per_s": on, "ratio_on_off": ratio,
               "triton_only_tokens_per_s": triton, "server_cpu_ms_per_token": cpu,
               "cpu_ratio_on_off": statistics.median(cpu["on"]) / statistics.median(cpu["off"]) if cpu["on"] and cpu["off"]
               else None,
               "ratio_triton_only_off": statistics.median(triton) / statistics.median(off) if triton else None,
               "base_tokens_per_s": base,
               "ratio_off_base": statistics.median(off) / statistics.median(base) if base and off else None,
               "collector": sink_stats, "runs": runs, "cpus": os.cpu_count(), "telemetry_thread": telemetry_cpu}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2))
    if ratio is not None:
        print(f"tracing on / off at {args.streams} streams: {ratio:.3f} tokens/s (median of {len(on)} vs {len(off)}), "
              f"{summary['cpu_ratio_on_off']:.3f} server CPU per token; collector got {sink_stats['posts']} exports, "
              f"{sink_stats['bytes'] / 1e6:.1f} MB -> {args.out}")
    for mode, line in telemetry_cpu.items():
        print(f"  {mode:>6}: {line or 'no telemetry line'}")
    for mode in modes:
        tps = [r["tokens_per_s"] for r in runs if r["mode"] == mode]
        print(f"  {mode:>6}: median {statistics.median(tps):8.1f} tokens/s, "
              f"{statistics.median(cpu[mode]):.3f} ms server CPU per token ({len(tps)} windows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
