"""Engine benchmark: our paged engine in-process vs HF transformers ``generate``, same workload, one run.

    .venv/bin/python bench/bench_engine.py [--model models/demo-target] [--quick]

Prints throughput ratios at 1, 8 and 32 concurrent requests (ours: the closed loop of
``bench/closed_loop.py``; HF: static batches of the same requests), TTFT/TPOT percentiles
(``bench/stats.py``, as every benchmark), the warm/cold TTFT ratio of a shared prefix, and
paged-vs-contiguous KV capacity. Writes bench/results/engine.json.
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from backend.config import EngineConfig  # noqa: E402
from backend.engine.llm_engine import LLMEngine  # noqa: E402
from bench.closed_loop import run_engine_level  # noqa: E402
from bench.report import git_commit, machine, write_json  # noqa: E402
from bench.stats import summarize  # noqa: E402
from bench.workload import mixed_workload, shared_stem_workload  # noqa: E402

REQUEST_TIMEOUT = 600.0  # seconds without any request finishing before the run is called failed


def run_engine(engine: LLMEngine, reqs, concurrency: int) -> dict:
    """Closed loop: ``concurrency`` requests in flight until all are done (the pipeline benchmark's driver)."""
    records, seconds = run_engine_level(engine, reqs, concurrency, level_seconds=math.inf,
                                        request_timeout=REQUEST_TIMEOUT)
    return engine_result(records, seconds)


def engine_result(records, seconds: float) -> dict:
    """Tokens/s and TTFT/TPOT p50/p90 (``bench.stats``, as every benchmark reports them) of one run."""
    s = summarize(records, seconds)
    if s["errors"]:
        raise RuntimeError(f"{s['errors']} of {s['requests']} requests failed (first: {s['first_error']})")
    return {"tokens": s["output_tokens"], "seconds": seconds, "tok_per_s": s["tok_per_s"],
            "ttft_p50_ms": s["ttft_ms"]["p50"], "ttft_p90_ms": s["ttft_ms"]["p90"],
            "tpot_p50_ms": s["tpot_ms"]["p50"], "tpot_p90_ms": s["tpot_ms"]["p90"]}


@torch.inference_mode()
def run_hf(hf, reqs, batch: int, pad_id: int) -> dict:
    """HF static batching: left-padded batches, each runs until its longest request is done."""
    t0 = time.perf_counter()
    useful = 0
    for s in range(0, len(reqs), batch):
        group = reqs[s:s + batch]
        width = max(len(r.prompt_ids) for r in group)
        ids = torch.full((len(group), width), pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for j, r in enumerate(group):
            ids[j, width - len(r.prompt_ids):] = torch.tensor(r.prompt_ids)
            mask[j, width - len(r.prompt_ids):] = 1
        n = max(r.max_tokens for r in group)
        hf.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=n, min_new_tokens=n,
                    pad_token_id=pad_id)
        useful += sum(r.max_tokens for r in group)
    wall = time.perf_counter() - t0
    return {"tokens": useful, "seconds": wall, "tok_per_s": useful / wall}


def prefix_ttft(model: str, tok: Tokenizer, kv_bytes: int) -> dict:
    reqs = shared_stem_workload(tok, 5, stem_tokens=896, suffix_tokens=32, max_tokens=4)
    engine = LLMEngine(EngineConfig(model_path=model, kv_cache_bytes=kv_bytes, max_num_batched_tokens=2048)).start()
    ttfts = []
    for r in reqs:
        ttfts.append(run_engine(engine, [r], 1)["ttft_p50_ms"])
    engine.shutdown()
    cold, warm = ttfts[0], statistics.mean(ttfts[1:])
    return {"cold_ttft_ms": cold, "warm_ttft_ms": warm, "warm_over_cold": warm / cold}


def kv_capacity(model: str, tok: Tokenizer, num_blocks: int) -> dict:
    """Peak concurrent sequences at a fixed block budget vs contiguous max-length reservation."""
    cfg = EngineConfig(model_path=model, num_kv_blocks=num_blocks, max_num_seqs=256, max_num_batched_tokens=4096)
    engine = LLMEngine(cfg)
    reqs = mixed_workload(tok, 96, seed=1)
    for i, r in enumerate(reqs):
        engine.add_request(f"k{i}", r.prompt_ids, r.params, lambda o: None)
    peak = 0
    while engine.has_work():
        engine.step()
        peak = max(peak, engine.stats().num_running)
    max_len = engine.scheduler.max_model_len
    contiguous = num_blocks * cfg.block_size // max_len
    return {"kv_tokens": num_blocks * cfg.block_size, "paged_peak_seqs": peak, "contiguous_seqs": contiguous,
            "ratio": peak / max(1, contiguous), "preemptions": engine.stats().num_preemptions}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="models/demo-target")
    ap.add_argument("--quick", action="store_true", help="fewer requests (smoke run)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--fast-decode", choices=("on", "off"), default="on", help="EngineConfig.fast_decode (shipped: on)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    from transformers import AutoModelForCausalLM

    tok = Tokenizer.from_file(str(Path(args.model) / "tokenizer.json"))
    pad = tok.token_to_id("<|pad|>") or 0
    hf = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    engine = LLMEngine(EngineConfig(model_path=args.model, kv_cache_bytes=512 << 20, max_num_seqs=64,
                                    fast_decode=args.fast_decode == "on")).start()
    results = {"throughput": []}
    plan = [(1, 3 if args.quick else 6), (8, 8 if args.quick else 16), (32, 32 if args.quick else 64)]
    print(f"{'conc':>4} {'ours tok/s':>10} {'HF tok/s':>9} {'ratio':>6} {'TTFT p50/p90 ms':>16} {'TPOT p50/p90 ms':>16}")
    for conc, n in plan:
        reqs = mixed_workload(tok, n, seed=conc)
        run_engine(engine, reqs[:1], 1)  # warm-up
        ours = run_engine(engine, reqs, conc)
        base = run_hf(hf, reqs, conc, pad)
        row = {"concurrency": conc, "requests": n, "ours": ours, "hf": base, "ratio": ours["tok_per_s"] / base["tok_per_s"]}
        results["throughput"].append(row)
        print(f"{conc:>4} {ours['tok_per_s']:>10.0f} {base['tok_per_s']:>9.0f} {row['ratio']:>6.2f} "
              f"{ours['ttft_p50_ms']:>7.1f}/{ours['ttft_p90_ms']:<8.1f} {ours['tpot_p50_ms']:>7.2f}/{ours['tpot_p90_ms']:<8.2f}",
              flush=True)
    engine.shutdown()
    results["prefix"] = prefix_ttft(args.model, tok, 256 << 20)
    p = results["prefix"]
    print(f"prefix cache (896-token stem): cold TTFT {p['cold_ttft_ms']:.1f} ms, warm {p['warm_ttft_ms']:.1f} ms, "
          f"warm/cold = {p['warm_over_cold']:.3f}")
    results["kv_capacity"] = kv_capacity(args.model, tok, num_blocks=512)
    k = results["kv_capacity"]
    print(f"KV capacity at {k['kv_tokens']} tokens: paged peak {k['paged_peak_seqs']} sequences vs contiguous "
          f"{k['contiguous_seqs']} -> {k['ratio']:.1f}x (preemptions {k['preemptions']})")
    results["machine"], results["commit"] = machine(load_before), git_commit()
    write_json(Path(__file__).resolve().parent / "results" / "engine.json", results)


if __name__ == "__main__":
    main()
