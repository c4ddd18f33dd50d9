"""Where the engine loop thread's time goes in-process, as bench_engine's llama.cpp section runs the engine.

    .venv/bin/python tools/profile/profile_loop.py                                  # 1 and 2 threads, batch 1, 8, 32
    .venv/bin/python tools/profile/profile_loop.py --python-load spin               # plus a Python thread that never blocks
    .venv/bin/python tools/profile/profile_loop.py --callback-us 300 --switch-interval 0.0005

``LLMEngine.add_request`` with the loop and output threads running, greedy, prompts of 64 tokens, 128 generated
(batch 1: three requests one after another; batch B: one wave of B). Per thread count and batch: decode tok/s
(``bench.harness.llamacpp.decode_tok_per_s``), steps, and the loop thread's busy time split into CPU, run queue and
blocked (``EngineStats.loop``, backend/engine/loop_clock.py): blocked is the time it slept inside steps, mostly
waiting for the GIL that another Python thread held when the loop wanted it back.

What else runs Python meanwhile: the output thread (the callbacks; ``--callback-us`` adds that much busy Python
per output, standing in for Triton's response send), and with ``--python-load spin`` a thread computing in
Python without pause (the worst case for the loop: with the default 5 ms switch interval each hand-off
can cost it up to 5 ms). ``--switch-interval`` sets ``sys.setswitchinterval`` for the run.
"""
from __future__ import annotations

import argparse
import math
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

import torch
from tokenizers import Tokenizer

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from bench.harness.closed_loop import run_engine_level
from bench.harness.llamacpp import decode_tok_per_s
from bench.harness.loop_time import describe
from bench.harness.workload import mixed_workload

PROMPT, GEN = 64, 128


def busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def with_callback_cost(engine: LLMEngine, seconds: float) -> None:
    """Every ``on_output`` callback of ``engine`` first computes ``seconds`` in Python."""
    add = engine.add_request

    def add_request(request_id, prompt, params, on_output):
        def slow(out):
            busy(seconds)
            on_output(out)
        return add(request_id, prompt, params, slow)
    engine.add_request = add_request


def run(engine: LLMEngine, tok: Tokenizer, batch: int) -> tuple[float, int, object]:
    """(decode tok/s, steps, the loop's time) over batch 1's three waves of one request, or one wave of B."""
    s0, t0 = engine.stats().steps, engine.stats().loop
    waves = []
    for w in range(3 if batch == 1 else 1):
        reqs = mixed_workload(tok, batch, seed=1000 * batch + w, prompt_range=(PROMPT, PROMPT),
                              output_range=(GEN, GEN))
        records, _ = run_engine_level(engine, reqs, batch, level_seconds=math.inf, request_timeout=300)
        if any(r is None or r.error for r in records):
            raise RuntimeError(f"requests failed at batch {batch}")
        waves.append(records)
    after = engine.stats()
    return decode_tok_per_s(waves), after.steps - s0, after.loop.since(t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(REPO / "models" / "demo-target"))
    ap.add_argument("--threads", default="1,2", help="cpu_threads of each engine (comma-separated)")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--switch-interval", type=float, help="sys.setswitchinterval for the run (default: Python's)")
    ap.add_argument("--python-load", choices=("none", "spin"), default="none")
    ap.add_argument("--callback-us", type=float, default=0.0, help="busy Python per output callback")
    ap.add_argument("--fast-decode", choices=("on", "off"), default="on")
    args = ap.parse_args()
    threads = [int(t) for t in args.threads.split(",")]
    batches = [int(b) for b in args.batches.split(",")]
    if args.switch_interval is not None:
        if args.switch_interval <= 0:
            ap.error("--switch-interval: must be > 0")
        sys.setswitchinterval(args.switch_interval)
    tok = Tokenizer.from_file(str(Path(args.model) / "tokenizer.json"))
    torch.set_num_threads(max(threads))
    stop = threading.Event()
    if args.python_load == "spin":
        def spin():
            while not stop.is_set():
                pass
        threading.Thread(target=spin, name="python-load", daemon=True).start()
    print(f"switch interval {sys.getswitchinterval() * 1e3:g} ms, python load {args.python_load}, "
          f"callback {args.callback_us:g} us per output")
    print(f"{'threads':>7} {'batch':>5} {'tok/s':>7} {'steps':>5} {'ms/step':>7}  loop thread")
    try:
        for t in threads:
            engine = LLMEngine(EngineConfig(model_path=args.model, kv_cache_bytes=512 << 20, max_num_seqs=64,
                                            cpu_threads=t, fast_decode=args.fast_decode == "on")).start()
            with_callback_cost(engine, args.callback_us * 1e-6)
            try:
                run(engine, tok, 1)   # warm-up
                for b in batches:
                    rate, steps, loop = run(engine, tok, b)
                    print(f"{t:>7} {b:>5} {rate:>7.0f} {steps:>5} {1e3 * loop.busy_s / max(1, steps):>7.3f}  "
                          f"{describe(loop)}", flush=True)
            finally:
                engine.shutdown()
    finally:
        stop.set()
    return 0


if __name__ == "__main__":
    sys.exit(main())
