"""Engine benchmark: our paged engine in-process vs HF transformers ``generate`` and llama.cpp, one run.

    python -m bench.bench_engine [--model models/demo-target] [--quick] [--sections hf,llamacpp]

Sections (``--sections``, default all):

- ``hf``: throughput ratios at 1, 8 and 32 concurrent requests (ours: the closed loop of
  ``bench/harness/closed_loop.py``; HF: static batches of the same requests), TTFT/TPOT percentiles
  (``bench/harness/stats.py``, as every benchmark);
- ``prefix``: the warm/cold TTFT ratio of a shared prefix;
- ``kv``: paged-vs-contiguous KV capacity;
- ``llamacpp``: decode tokens/s against llama.cpp's ``llama-batched-bench`` on a GGUF f32 conversion of the
  same checkpoint (``bench/harness/llamacpp.py``; built by ``tools/build_llamacpp.sh``), prompts of 64 tokens, 128
  generated, 1 and 32 sequences, at each ``--llamacpp-threads``; skipped with the reason when not built.

Writes bench/results/engine.json (and engine_llamacpp.png).
"""
from __future__ import annotations

import argparse
import functools
import math
import os
import statistics
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from bench.harness.closed_loop import run_engine_level
from bench.harness.llamacpp import LlamaCpp, Skipped, decode_tok_per_s, locate, plot_comparison, run_batched_bench
from bench.harness.report import git_commit, goal, machine, verdict, write_json
from bench.harness.stats import summarize
from bench.harness.workload import mixed_workload, shared_stem_workload

REQUEST_TIMEOUT = 600.0  # seconds without any request finishing before the run is called failed
SECTIONS = ("hf", "prefix", "kv", "llamacpp")
LLAMACPP_PROMPT, LLAMACPP_GEN, LLAMACPP_PARALLEL = 64, 128, (1, 32)


def run_engine(engine: LLMEngine, reqs, concurrency: int) -> dict:
    """Closed loop: ``concurrency`` requests in flight until all are done (the pipeline benchmark's driver)."""
    records, seconds = run_engine_level(engine, reqs, concurrency, level_seconds=math.inf,
                                        request_timeout=REQUEST_TIMEOUT)
    return engine_result(records, seconds)


def engine_result(records, seconds: float) -> dict:
    """Tokens/s and TTFT/TPOT p50/p90 (``bench.harness.stats``, as every benchmark reports them) of one run."""
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


def hf_comparison(model: str, tok: Tokenizer, quick: bool, fast_decode: bool) -> list[dict]:
    """Ours vs HF ``generate`` on the same mixed requests at 1, 8 and 32 concurrent."""
    from transformers import AutoModelForCausalLM

    pad = tok.token_to_id("<|pad|>") or 0
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    engine = LLMEngine(EngineConfig.from_settings(model_path=model, kv_cache_bytes=512 << 20, max_num_seqs=64,
                                                  fast_decode=fast_decode)).start()
    rows = []
    plan = [(1, 3 if quick else 6), (8, 8 if quick else 16), (32, 32 if quick else 64)]
    print(f"{'conc':>4} {'ours tok/s':>10} {'HF tok/s':>9} {'ratio':>6} {'TTFT p50/p90 ms':>16} "
          f"{'TPOT p50/p90 ms':>16}")
    for conc, n in plan:
        reqs = mixed_workload(tok, n, seed=conc)
        run_engine(engine, reqs[:1], 1)  # warm-up
        ours = run_engine(engine, reqs, conc)
        base = run_hf(hf, reqs, conc, pad)
        row = {"concurrency": conc, "requests": n, "ours": ours, "hf": base,
               "ratio": ours["tok_per_s"] / base["tok_per_s"]}
        rows.append(row)
        print(f"{conc:>4} {ours['tok_per_s']:>10.0f} {base['tok_per_s']:>9.0f} {row['ratio']:>6.2f} "
              f"{ours['ttft_p50_ms']:>7.1f}/{ours['ttft_p90_ms']:<8.1f} "
              f"{ours['tpot_p50_ms']:>7.2f}/{ours['tpot_p90_ms']:<8.2f}",
              flush=True)
    engine.shutdown()
    return rows


def prefix_ttft(model: str, tok: Tokenizer, kv_bytes: int) -> dict:
    reqs = shared_stem_workload(tok, 5, stem_tokens=896, suffix_tokens=32, max_tokens=4)
    engine = LLMEngine(EngineConfig.from_settings(model_path=model, kv_cache_bytes=kv_bytes,
                                                  max_num_batched_tokens=2048)).start()
    ttfts = []
    for r in reqs:
        ttfts.append(run_engine(engine, [r], 1)["ttft_p50_ms"])
    engine.shutdown()
    cold, warm = ttfts[0], statistics.mean(ttfts[1:])
    return {"cold_ttft_ms": cold, "warm_ttft_ms": warm, "warm_over_cold": warm / cold}


def kv_capacity(model: str, tok: Tokenizer, num_blocks: int) -> dict:
    """Peak concurrent sequences at a fixed block budget vs contiguous max-length reservation."""
    cfg = EngineConfig.from_settings(model_path=model, num_kv_blocks=num_blocks, max_num_seqs=256,
                                     max_num_batched_tokens=4096)
    engine = LLMEngine(cfg)
    reqs = mixed_workload(tok, 96, seed=1)
    for i, r in enumerate(reqs):
        engine.add_request(f"k{i}", r.prompt_ids, r.params, lambda o: None)
    peak = 0
    while engine.has_work():
        engine.step()
        peak = max(peak, engine.stats().num_running)
    max_len = engine.scheduler.max_model_len
    contiguous = num_blocks * cfg.cache.block_size // max_len
    return {"kv_tokens": num_blocks * cfg.cache.block_size, "paged_peak_seqs": peak, "contiguous_seqs": contiguous,
            "ratio": peak / max(1, contiguous), "preemptions": engine.stats().num_preemptions}


def ours_decode(engine: LLMEngine, tok: Tokenizer, batch: int, waves: int) -> float:
    """Our decode tok/s (``bench.harness.llamacpp.decode_tok_per_s``) over ``waves`` waves of ``batch`` requests."""
    got = []
    for w in range(waves):
        reqs = mixed_workload(tok, batch, seed=1000 * batch + w, prompt_range=(LLAMACPP_PROMPT, LLAMACPP_PROMPT),
                              output_range=(LLAMACPP_GEN, LLAMACPP_GEN))
        records, _ = run_engine_level(engine, reqs, batch, level_seconds=math.inf, request_timeout=REQUEST_TIMEOUT)
        if any(r is None or r.error for r in records):
            raise RuntimeError(f"engine requests failed at batch {batch}")
        got.append(records)
    return decode_tok_per_s(got)


def llamacpp_comparison(model: str, tok: Tokenizer, llama: LlamaCpp, threads: list[int], *, repeats: int = 1,
                        waves_at_1: int = 3, fast_decode: bool = True) -> list[dict]:
    """Decode tok/s, ours (``LLMEngine.add_request``, greedy, EOS ignored, engine built with ``cpu_threads`` = the
    thread count) vs ``llama-batched-bench``, per thread count, batch size and repeat. Each repeat measures every
    thread count, in alternating order (an engine built afresh for each), and within a thread count alternates
    which side goes first (llama.cpp first in the first): load that drifts over the run then touches both thread
    counts alike, and 2 threads / 1 thread is the median of the repeats' paired ratios. At batch 1,
    ``waves_at_1`` requests one after another; at B, one wave of B. With several repeats, the medians are
    printed (and returned as ``repeat`` "median")."""
    theirs = functools.partial(run_batched_bench, llama, prompt_tokens=LLAMACPP_PROMPT, gen_tokens=LLAMACPP_GEN,
                               parallel=LLAMACPP_PARALLEL)
    rows = []
    print(f"{'threads':>7} {'batch':>5} {'repeat':>6} {'ours tok/s':>10} {'llama.cpp tok/s':>15} "
          f"{'ours/llama.cpp':>14}")
    for rep in range(repeats):
        for t in (threads if rep % 2 == 0 else threads[::-1]):
            engine = LLMEngine(EngineConfig.from_settings(model_path=model, kv_cache_bytes=512 << 20,
                                                          max_num_seqs=64, cpu_threads=t,
                                                          fast_decode=fast_decode)).start()
            try:
                run_engine(engine, mixed_workload(tok, 1, seed=99, prompt_range=(64, 64), output_range=(8, 8)), 1)
                if rep % 2 == 0:
                    base = theirs(threads=t)
                mine = {b: ours_decode(engine, tok, b, waves_at_1 if b == 1 else 1) for b in LLAMACPP_PARALLEL}
                if rep % 2 == 1:
                    base = theirs(threads=t)
            finally:
                engine.shutdown()
            for b in LLAMACPP_PARALLEL:
                ref = base[b]
                rows.append({"threads": t, "batch": b, "repeat": rep, "ours_tok_s": mine[b],
                             "llamacpp_tok_s": ref.speed_tg, "ratio": mine[b] / ref.speed_tg, "llamacpp": vars(ref)})
                print(f"{t:>7} {b:>5} {rep:>6} {mine[b]:>10.0f} {ref.speed_tg:>15.0f} {rows[-1]['ratio']:>14.2f}",
                      flush=True)
    if repeats > 1:
        for t in threads:
            for b in LLAMACPP_PARALLEL:
                got = [r for r in rows if (r["threads"], r["batch"]) == (t, b)]
                med = {k: statistics.median(r[k] for r in got) for k in ("ours_tok_s", "llamacpp_tok_s", "ratio")}
                rows.append({"threads": t, "batch": b, "repeat": "median", **med})
                print(f"{t:>7} {b:>5} {'median':>6} {med['ours_tok_s']:>10.0f} {med['llamacpp_tok_s']:>15.0f} "
                      f"{med['ratio']:>14.2f}", flush=True)
    for b in LLAMACPP_PARALLEL:
        paired = thread_ratios(rows, b)
        if paired:
            g = goal(statistics.median(paired), at_least=1.0)
            print(f"ours at batch {b}: 2 threads / 1 thread = {g['ratio']:.2f}{verdict(g)} "
                  f"(median of {len(paired)} paired repeats: {', '.join(f'{x:.2f}' for x in paired)})")
    return rows


def thread_ratios(rows: list[dict], batch: int) -> list[float]:
    """Ours at 2 threads / ours at 1 thread at ``batch``, one ratio per repeat that measured both."""
    by = {(r["threads"], r["repeat"]): r["ours_tok_s"] for r in rows if r["batch"] == batch and r["repeat"] != "median"}
    return [by[2, rep] / by[1, rep] for (t, rep) in sorted(by, key=str) if t == 1 and (2, rep) in by]


def llamacpp_section(model: str, tok: Tokenizer, threads: list[int], binary: str | None, gguf: str | None,
                     out: Path, repeats: int = 1, fast_decode: bool = True) -> dict:
    """The llama.cpp comparison and its plot, or the printed reason it is skipped (``{"skipped": reason}``)."""
    llama = locate(Path(model), binary, gguf)
    if isinstance(llama, Skipped):
        print(llama.reason, flush=True)
        return {"skipped": llama.reason}
    print(f"llama.cpp: {llama.binary} on {llama.gguf}; prompts of {LLAMACPP_PROMPT} tokens, {LLAMACPP_GEN} generated; "
          f"decode tok/s (llama.cpp: S_TG of llama-batched-bench)", flush=True)
    rows = llamacpp_comparison(model, tok, llama, threads, repeats=repeats, fast_decode=fast_decode)
    out.mkdir(parents=True, exist_ok=True)
    shown = [r for r in rows if r["repeat"] == ("median" if repeats > 1 else 0)]
    plot_comparison(shown, out / "engine_llamacpp.png",
                    title=f"{Path(model).name}: decode tok/s" + (f", median of {repeats}" if repeats > 1 else ""))
    return {"binary": str(llama.binary), "gguf": str(llama.gguf), "prompt_tokens": LLAMACPP_PROMPT,
            "gen_tokens": LLAMACPP_GEN, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="models/demo-target")
    ap.add_argument("--quick", action="store_true", help="fewer requests (smoke run)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--fast-decode", choices=("on", "off"), default="on", help="llm.fast_decode (shipped: on)")
    ap.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated, of {', '.join(SECTIONS)}")
    ap.add_argument("--llamacpp-threads", default="1,2", help="thread counts of the llama.cpp comparison")
    ap.add_argument("--llamacpp-repeats", type=int, default=1,
                    help="llama.cpp / ours pairs per thread count, alternating which goes first; medians printed")
    ap.add_argument("--llamacpp-bin", help="llama-batched-bench (default: $LLAMACPP_BIN, else .cache/llamacpp/)")
    ap.add_argument("--llamacpp-gguf", help="GGUF of --model (default: $LLAMACPP_GGUF, else .cache/llamacpp/gguf/)")
    args = ap.parse_args()
    sections = [s for s in args.sections.split(",") if s]
    if unknown := sorted(set(sections) - set(SECTIONS)):
        ap.error(f"--sections: unknown {', '.join(unknown)} (known: {', '.join(SECTIONS)})")
    try:
        llama_threads = [int(t) for t in args.llamacpp_threads.split(",")]
    except ValueError:
        ap.error(f"--llamacpp-threads: comma-separated integers, got {args.llamacpp_threads!r}")
    if args.llamacpp_repeats < 1:
        ap.error(f"--llamacpp-repeats: must be >= 1, got {args.llamacpp_repeats}")
    if any(t < 1 for t in llama_threads):
        ap.error(f"--llamacpp-threads: each must be >= 1, got {args.llamacpp_threads!r}")
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    tok = Tokenizer.from_file(str(Path(args.model) / "tokenizer.json"))
    results: dict = {"model": args.model}
    if "hf" in sections:
        results["throughput"] = hf_comparison(args.model, tok, args.quick, args.fast_decode == "on")
    if "prefix" in sections:
        results["prefix"] = prefix_ttft(args.model, tok, 256 << 20)
        p = results["prefix"]
        print(f"prefix cache (896-token stem): cold TTFT {p['cold_ttft_ms']:.1f} ms, warm {p['warm_ttft_ms']:.1f} ms, "
              f"warm/cold = {p['warm_over_cold']:.3f}")
    if "kv" in sections:
        results["kv_capacity"] = kv_capacity(args.model, tok, num_blocks=512)
        k = results["kv_capacity"]
        print(f"KV capacity at {k['kv_tokens']} tokens: paged peak {k['paged_peak_seqs']} sequences vs contiguous "
              f"{k['contiguous_seqs']} -> {k['ratio']:.1f}x (preemptions {k['preemptions']})")
    out = Path(__file__).resolve().parent / "results"
    if "llamacpp" in sections:
        results["llamacpp"] = llamacpp_section(args.model, tok, llama_threads, args.llamacpp_bin, args.llamacpp_gguf,
                                               out, repeats=args.llamacpp_repeats,
                                               fast_decode=args.fast_decode == "on")
    results["machine"], results["commit"] = machine(load_before), git_commit()
    write_json(out / "engine.json", results)


if __name__ == "__main__":
    main()
