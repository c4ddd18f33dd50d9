"""Ours vs llama.cpp in every weight format, thread count and batch size, on the 300M-class and 82M random Llamas.

    python -m bench.bench_formats [--models 300m,82m] [--threads 1,2] [--batches 1,8,32] [--gen 64] [--rounds 2]

Builds the models with ``bench/harness/random_llama.py`` (300M-class: 24 layers x 1024, intermediate 2816, GQA 16/4,
vocabulary 4,096; 82M: its default shape) and converts each for llama.cpp with ``tools/build_llamacpp.sh`` (F32,
then Q8_0 and Q4_0 through ``llama-quantize``; llama.cpp built without AMX). Measures the machine's read bandwidth
per thread count (``read_bandwidth``). Then per round, model, format (ours ``none`` / ``int8`` / ``int4`` at
``--group`` against F32 / Q8_0 / Q4_0) and thread count: ``llama-batched-bench`` (random prompts of 64 tokens,
``--gen`` generated, one run per batch size) and our engine in-process (the native step, ``fast_decode`` on as
shipped; ``cpu_threads`` = the thread count, waves of ``batch`` requests with prompts of 64 tokens, BOS included,
and ``--gen`` output tokens, EOS ignored; decode tok/s as llama.cpp's S_TG:
``bench.harness.llamacpp.decode_tok_per_s``), the side going first alternating between rounds. Prompt throughput: ours, the largest batch's prompt tokens over the time from the wave's start until every request had its
first token; llama.cpp, its S_PP at that batch. At batch 1 the weight bytes a decode step reads per second are
given as a fraction of the read bandwidth at that thread count. The table gives the median of the rounds per cell;
then the lowest cell and the geometric mean of the decode ratios. Writes bench/results/formats.json.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.model.config import ModelConfig
from bench.harness.closed_loop import run_engine_level
from bench.harness.llamacpp import DEFAULT_DIR, LlamaCpp, decode_tok_per_s, run_batched_bench
from bench.harness.report import git_commit, machine, write_json
from bench.harness.workload import mixed_workload
from bench.harness.random_llama import SHAPES
from bench.harness.random_llama import make as make_random_llama

REPO = Path(__file__).resolve().parents[1]
MODELS = SHAPES   # "300m", "82m": bench/harness/random_llama.py's shapes
FORMATS = (("none", "f32"), ("int8", "q8_0"), ("int4", "q4_0"))   # ours, llama.cpp's
PROMPT = 64
REQUEST_TIMEOUT = 900.0


def ensure_model(name: str) -> Path:
    out = REPO / ".cache" / "models" / f"random-{name}"
    if not (out / "model.safetensors").is_file():
        print(f"building {out}", flush=True)
        make_random_llama(out, **MODELS[name])
    return out


def ensure_gguf(model: Path) -> dict[str, Path]:
    """The F32 / Q8_0 / Q4_0 GGUF files of ``model`` (``tools/build_llamacpp.sh`` makes what is missing)."""
    files = {t: DEFAULT_DIR / "gguf" / f"{model.name}-{t}.gguf" for _, t in FORMATS}
    if not all(f.is_file() for f in files.values()):
        subprocess.run(["bash", str(REPO / "tools" / "build_llamacpp.sh"), str(model)], check=True,
                       env={**os.environ, "PY": sys.executable})
    return files


def read_bandwidth(threads: int, gib: float = 1.0, reps: int = 5) -> float:
    """Bytes per second of a sum over a ``gib`` GiB float32 tensor (out of cache), best of ``reps``."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        x = torch.ones(int(gib * (1 << 30)) // 4)
        best = math.inf
        for _ in range(reps):
            t = time.perf_counter()
            x.sum()
            best = min(best, time.perf_counter() - t)
        return x.numel() * 4 / best
    finally:
        torch.set_num_threads(before)


def weight_bytes(cfg: ModelConfig, mode: str, group: int) -> float:
    """Bytes of weights one batch-1 decode step reads: the projections and the LM head (int8 in the quantized modes,
    with one float scale a row; int4 projections: half a byte a weight plus a float scale and zero a group)."""
    d, i, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    proj = cfg.num_hidden_layers * (d * (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * hd
                                    + cfg.num_attention_heads * hd * d + 3 * d * i)
    head = cfg.vocab_size * d
    if mode == "none":
        return 4.0 * (proj + head)
    head_bytes = head + 4 * cfg.vocab_size
    return (proj + 4 * proj / d if mode == "int8" else proj / 2 + 8 * proj / group) + head_bytes


def ours(model: Path, tok: Tokenizer, mode: str, group: int, threads: int, batches: list[int], gen: int) -> dict:
    """{batch: (decode tok/s, prompt tok/s)} of our engine."""
    engine = LLMEngine(EngineConfig.from_settings(model_path=str(model), quantization=mode,
                                                  quantization_group_size=group,
                                                  kv_cache_bytes=1 << 30, max_num_seqs=64, cpu_threads=threads,
                                                  fast_decode=True)).start()   # the native step, as shipped
    try:
        warm = mixed_workload(tok, 1, seed=99, prompt_range=(PROMPT - 1, PROMPT - 1), output_range=(8, 8))
        run_engine_level(engine, warm, 1, level_seconds=math.inf, request_timeout=REQUEST_TIMEOUT)
        got = {}
        for b in batches:
            reqs = mixed_workload(tok, b, seed=1000 * b, prompt_range=(PROMPT - 1, PROMPT - 1), output_range=(gen, gen))
            records, _ = run_engine_level(engine, reqs, b, level_seconds=math.inf, request_timeout=REQUEST_TIMEOUT)
            if any(r is None or r.error for r in records):
                raise RuntimeError(f"engine requests failed at batch {b}")
            first = max(r.events[0][0] for r in records) - min(r.start for r in records)
            got[b] = (decode_tok_per_s([records]), b * PROMPT / first)
        return got
    finally:
        engine.shutdown()


def theirs(binary: Path, gguf: Path, threads: int, batches: list[int], gen: int) -> dict:
    rows = run_batched_bench(LlamaCpp(binary, gguf), threads=threads, prompt_tokens=PROMPT, gen_tokens=gen,
                             parallel=batches)
    return {b: (rows[b].speed_tg, rows[b].speed_pp) for b in batches}


def cell_rows(model: str, cfg: ModelConfig, group: int, bandwidth: dict[int, float], samples: dict) -> list[dict]:
    """One row per (format, threads, batch): medians over the rounds of ours, llama.cpp and their ratio."""
    rows = []
    for (mode, fmt, t), rounds in samples.items():
        for b in rounds[0]["ours"]:
            o = statistics.median(r["ours"][b][0] for r in rounds)
            ll = statistics.median(r["llamacpp"][b][0] for r in rounds)
            row = {"model": model, "format": mode, "llamacpp_format": fmt, "threads": t, "batch": b,
                   "ours_tok_s": o, "llamacpp_tok_s": ll, "ratio": o / ll,
                   "rounds": [r["ours"][b][0] / r["llamacpp"][b][0] for r in rounds]}
            if b == 1:
                row["bandwidth_fraction"] = o * weight_bytes(cfg, mode, group) / bandwidth[t]
            if b == max(rounds[0]["ours"]):
                op = statistics.median(r["ours"][b][1] for r in rounds)
                lp = statistics.median(r["llamacpp"][b][1] for r in rounds)
                row.update(ours_prompt_tok_s=op, llamacpp_prompt_tok_s=lp, prompt_ratio=op / lp)
            rows.append(row)
    return rows


def print_rows(rows: list[dict]) -> None:
    print(f"{'model':>5} {'format':>6} {'thr':>3} {'batch':>5} {'ours':>8} {'llama.cpp':>9} {'ratio':>6} "
          f"{'BW frac':>7} {'prompt ours/llama.cpp (ratio)':>30}  rounds")
    for r in rows:
        bw = f"{r['bandwidth_fraction']:.2f}" if "bandwidth_fraction" in r else ""
        pp = (f"{r['ours_prompt_tok_s']:.0f}/{r['llamacpp_prompt_tok_s']:.0f} ({r['prompt_ratio']:.2f})"
              if "prompt_ratio" in r else "")
        print(f"{r['model']:>5} {r['format']:>6} {r['threads']:>3} {r['batch']:>5} {r['ours_tok_s']:>8.1f} "
              f"{r['llamacpp_tok_s']:>9.1f} {r['ratio']:>6.2f} {bw:>7} {pp:>30}  "
              f"{', '.join(f'{x:.2f}' for x in r['rounds'])}", flush=True)
    ratios = [r["ratio"] for r in rows]
    low = min(rows, key=lambda r: r["ratio"])
    print(f"geometric mean of the decode ratios {math.exp(statistics.mean(map(math.log, ratios))):.2f}; lowest "
          f"{low['ratio']:.2f} ({low['model']} {low['format']} {low['threads']} thr batch {low['batch']})")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="300m,82m")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--formats", default="none,int8,int4")
    ap.add_argument("--gen", type=int, default=64, help="generated tokens per sequence")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--group", type=int, default=128, help="our int4 group size")
    args = ap.parse_args(argv)
    threads = [int(t) for t in args.threads.split(",")]
    batches = [int(b) for b in args.batches.split(",")]
    formats = [f for f in FORMATS if f[0] in args.formats.split(",")]
    load = os.getloadavg()
    binary = DEFAULT_DIR / "llama-batched-bench"
    models = {name: ensure_model(name) for name in args.models.split(",")}
    ggufs = {name: ensure_gguf(path) for name, path in models.items()}
    bandwidth = {t: read_bandwidth(t) for t in threads}
    print("read bandwidth: " + ", ".join(f"{t} thr {bw / 1e9:.1f} GB/s" for t, bw in bandwidth.items()), flush=True)
    samples: dict = {name: {} for name in models}
    for rnd in range(args.rounds):
        for name, path in models.items():
            tok = Tokenizer.from_file(str(path / "tokenizer.json"))
            for mode, fmt in formats:
                for t in threads:
                    order = ("llamacpp", "ours") if (rnd + t) % 2 == 0 else ("ours", "llamacpp")
                    got = {}
                    for side in order:
                        got[side] = theirs(binary, ggufs[name][fmt], t, batches, args.gen) if side == "llamacpp" \
                            else ours(path, tok, mode, args.group, t, batches, args.gen)
                    samples[name].setdefault((mode, fmt, t), []).append(got)
                    print(f"round {rnd} {name} {mode}/{fmt} {t} thr: " + ", ".join(
                        f"B={b} {got['ours'][b][0]:.1f}/{got['llamacpp'][b][0]:.1f}" for b in batches)
                        + f" (load {os.getloadavg()[0]:.2f})", flush=True)
    rows = [r for name, path in models.items()
            for r in cell_rows(name, ModelConfig.from_dict(json.loads((path / "config.json").read_text())),
                               args.group, bandwidth, samples[name])]
    print_rows(rows)
    write_json(REPO / "bench" / "results" / "formats.json",
               {"rows": rows, "bandwidth": bandwidth, "args": vars(args), "machine": machine(load),
                "commit": git_commit()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
