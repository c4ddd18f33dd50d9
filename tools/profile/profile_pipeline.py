"""Where a streamed response's CPU time goes: CPU seconds per process of the pipeline, per response and per token.

    .venv/bin/python -m tools.profile.profile_pipeline                        # 1 stream, shipped config, 12 requests
    .venv/bin/python -m tools.profile.profile_pipeline --concurrency 32 --requests 64
    .venv/bin/python -m tools.profile.profile_pipeline --py-spy               # + sampled Python stacks of the stubs
    .venv/bin/python -m tools.profile.profile_pipeline --set llm.stream_responses_per_s=0 --set llm.stream_interval=1

Starts tritonserver (as ``bench_pipeline.py`` does: the shipped ``model_repository/`` plus ``--set``), warms
it up, then sends the pipeline benchmark's requests through the ensemble in a closed loop, and reads each
process's CPU time (``utime + stime`` of ``/proc/<pid>/stat``, all threads) before and after: tritonserver,
the ``preprocess`` / ``llm`` / ``postprocess`` stubs and this client. CPU time, unlike wall time, does not
grow while other jobs hold the cores, so the split is readable on a busy machine. The ``llm`` stub's time
includes the engine's forward; its per-thread split (engine loop vs output thread vs the rest) comes from
``/proc/<pid>/task``. TPOT p50 is printed twice: as the client saw it and as the engine measured it (``tpot_s``
of the llm's request log lines): their gap is what the delivery of the first and last tokens adds, the
engine's own TPOT against an in-process run is what the pipeline's processes take from the engine. With ``--py-spy``, ``py-spy record`` samples the ``llm`` and ``postprocess`` stubs
(``--nonblocking``, 250 Hz) and the hottest Python frames of each thread are printed; the raw collapsed
stacks are written to ``bench/results/profile_<model>.txt``.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

from bench.harness.closed_loop import run_pipeline_level
from bench.harness.server import LauncherError, engine_config, repository_overrides, run_with_server
from tools.soak import server_processes as soak_server_processes
from bench.harness.stats import percentile, request_metrics
from bench.harness.workload import make_workload

TICKS = os.sysconf("SC_CLK_TCK")
STUBS = ("preprocess", "llm", "postprocess")


def cpu_seconds(stat_path: Path) -> float:
    """utime + stime of a ``/proc/.../stat`` file, in seconds (fields 14 and 15; the name may hold spaces)."""
    text = stat_path.read_text()
    fields = text[text.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def server_processes(root_pid: int) -> dict[str, int]:
    """tritonserver (``root_pid``) and its Python stubs, named by the model each stub serves."""
    return {name.removeprefix("stub:"): pid for name, pid in soak_server_processes(root_pid).items()}


def thread_seconds(pid: int) -> dict[int, float]:
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out[int(task.name)] = cpu_seconds(task / "stat")
        except (OSError, ValueError):
            pass
    return out


def engine_tpots(log_path: Path | None, start: int) -> list[float]:
    """``tpot_s`` of the llm's request log lines written to the server log after byte ``start``."""
    if log_path is None or not log_path.is_file():
        return []
    with open(log_path, "rb") as f:
        f.seek(start)
        lines = f.read().decode(errors="replace").splitlines()
    out = []
    for line in lines:
        if '"request_finished"' not in line:
            continue
        try:
            rec = json.loads(line[line.index("{"):])
        except ValueError:
            continue
        if rec.get("tpot_s") is not None:
            out.append(float(rec["tpot_s"]))
    return out


class PySpy:
    """``py-spy record`` of some processes for the run, raw (collapsed-stack) output, one file per process."""

    def __init__(self, pids: dict[str, int], out: Path, rate: int = 250):
        exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        self.files = {name: out / f"profile_{name}.txt" for name in pids}
        self.procs = [subprocess.Popen(
            [exe, "record", "--pid", str(pid), "--rate", str(rate), "--nonblocking", "--threads", "--idle",
             "--format", "raw", "--output", str(self.files[name])],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for name, pid in pids.items()]

    def stop(self) -> None:
        for p in self.procs:
            p.send_signal(2)   # SIGINT: py-spy writes its output and exits
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()


def hottest(path: Path, top: int) -> list[str]:
    """Per thread: samples in Python code (the rest: in the stub's C++ loop, outside Python), the frames most
    often on its stack (inclusive) and the innermost frames (where it was)."""
    inclusive: dict[str, Counter] = {}
    leaves: dict[str, Counter] = {}
    totals: Counter = Counter()
    if not path.is_file():
        return [f"  (no py-spy output at {path})"]
    for line in path.read_text(errors="replace").splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        thread, *frames = stack.split(";")
        count = int(n)
        totals[thread] += count
        if not frames:
            continue
        where = [(f.split(" (")[0], f.rsplit("/", 1)[-1].lstrip("(").rstrip(")")) for f in frames]
        leaves.setdefault(thread, Counter())[f"{where[-1][0]} ({where[-1][1]})"] += count
        for name in {f"{fn} ({loc.split(':')[0]})" for fn, loc in where}:
            inclusive.setdefault(thread, Counter())[name] += count
    lines = []
    for thread, counter in sorted(inclusive.items(), key=lambda kv: -sum(leaves[kv[0]].values())):
        in_python = sum(leaves[thread].values())
        lines.append(f"  {thread}: {in_python} samples in Python of {totals[thread]}")
        lines.append("    inclusive:")
        lines += [f"      {100 * c / in_python:5.1f}%  {name}" for name, c in counter.most_common(top)]
        lines.append("    innermost:")
        lines += [f"      {100 * c / in_python:5.1f}%  {name}" for name, c in leaves[thread].most_common(top)]
    return lines


async def drive(url: str, items, concurrency: int, model: str):
    import tritonclient.grpc.aio as grpcclient

    client = grpcclient.InferenceServerClient(url)
    try:
        return await run_pipeline_level(client, items, concurrency, model=model, level_seconds=600,
                                        request_timeout=120)
    finally:
        await client.close()


def measure(args, url: str, server) -> int:
    if server is None:
        raise LauncherError("--url is not supported: the processes are found as children of the started server")
    cfg, _ = engine_config(args.overrides)
    warm = make_workload(Path(cfg.model.model_path), 2, args.seed - 1, (32, 64), (8, 8))
    items = make_workload(Path(cfg.model.model_path), args.requests, args.seed, (32, 256), tuple(args.output_tokens))
    asyncio.run(drive(url, warm, 1, args.triton_model))
    pids = server_processes(server.proc.pid)
    missing = [m for m in STUBS if m not in pids]
    if missing:
        raise LauncherError(f"stub processes not found for {missing}")
    log_start = server.log_path.stat().st_size if server.log_path is not None else 0
    spy = PySpy({m: pids[m] for m in ("llm", "postprocess")}, args.out) if args.py_spy else None
    before = {name: cpu_seconds(Path(f"/proc/{pid}/stat")) for name, pid in pids.items()}
    llm_threads_before = thread_seconds(pids["llm"])
    client_before = time.process_time()
    t0 = time.perf_counter()
    records, _ = asyncio.run(drive(url, items, args.concurrency, args.triton_model))
    wall = time.perf_counter() - t0
    used = {name: cpu_seconds(Path(f"/proc/{pid}/stat")) - before[name] for name, pid in pids.items()}
    used["client"] = time.process_time() - client_before
    llm_threads = {tid: s - llm_threads_before.get(tid, 0.0) for tid, s in thread_seconds(pids["llm"]).items()}
    if spy is not None:
        spy.stop()
    done = [r for r in records if r is not None and r.error is None]
    responses = sum(len(r.events) for r in done)
    tokens = sum(r.tokens for r in done)
    tpot = [m["tpot"] for m in map(request_metrics, done) if m.get("tpot") is not None]
    time.sleep(0.5)   # the llm writes a request's log line on its telemetry thread, after the final response
    engine_tpot = engine_tpots(server.log_path, log_start)
    print(f"\n{len(done)}/{len(records)} requests, {tokens} tokens in {responses} responses with tokens "
          f"({tokens / max(responses, 1):.2f} tokens per response), {wall:.2f} s wall, "
          f"{tokens / wall:.0f} tok/s, load {os.getloadavg()[0]:.2f}")
    print(f"TPOT p50: {1e3 * percentile(tpot, 50):.3f} ms as the client saw it, {1e3 * percentile(engine_tpot, 50):.3f} ms "
          f"in the engine (llm request log, {len(engine_tpot)} requests)")
    print(f"{'process':<12} {'CPU s':>7} {'% of wall':>9} {'ms/response':>11} {'us/token':>9}")
    for name in ("tritonserver", *STUBS, "client"):
        s = used[name]
        print(f"{name:<12} {s:7.2f} {100 * s / wall:9.1f} {1e3 * s / max(responses, 1):11.3f} "
              f"{1e6 * s / max(tokens, 1):9.1f}")
    total = sum(used.values())
    print(f"{'all':<12} {total:7.2f} {100 * total / wall:9.1f} {1e3 * total / max(responses, 1):11.3f} "
          f"{1e6 * total / max(tokens, 1):9.1f}")
    print("llm stub threads (CPU s): " + ", ".join(
        f"{tid}={s:.2f}" for tid, s in sorted(llm_threads.items(), key=lambda kv: -kv[1]) if s >= 0.01))
    if spy is not None:
        for name, path in spy.files.items():
            print(f"\npy-spy {name} ({path}):")
            print("\n".join(hottest(path, args.top)))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", action="append", default=[], metavar="MODEL.KEY=VALUE",
                    help="config.pbtxt parameter override for the started server")
    ap.add_argument("--model", type=Path, help="checkpoint folder (default: the shipped llm config's)")
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--requests", type=int, default=12)
    ap.add_argument("--output-tokens", type=int, nargs=2, default=(64, 128), metavar=("MIN", "MAX"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--py-spy", action="store_true", help="sample the llm and postprocess stubs with py-spy")
    ap.add_argument("--top", type=int, default=14, help="frames shown per thread with --py-spy")
    ap.add_argument("--triton-model", default="ensemble")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = ap.parse_args(argv)
    if args.concurrency < 1 or args.requests < 1:
        ap.error("--concurrency and --requests: positive integers")
    args.out.mkdir(parents=True, exist_ok=True)
    args.overrides = repository_overrides(args.model.resolve() if args.model else None, args.set)
    got = run_with_server(lambda url, server: measure(args, url, server), args.overrides, url=None, out=args.out,
                          name="profile", server_timeout=300)
    return 1 if got is None else got


if __name__ == "__main__":
    sys.exit(main())
