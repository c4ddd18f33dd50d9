"""Quantization acceptance numbers: each weight mode against the unquantized model, in one run.

On the demo target: held-out perplexity and its delta, greedy agreement (share of identical first
tokens and mean identical prefix over held-out prompts, 32 tokens each), a long-context retrieval
probe (the mean log-probability of a fact planted early in a ~900-token prompt, re-quoted at the end),
and decode tokens/s at batch 1 and 32. One 2048 x 768 layer at one token, weights out of cache: CPU
microseconds of this thread per call (robust to other jobs on a shared machine; QuantLinear, the native
quantized GEMM when built; "int4 (a)": the few-token dequantize-and-FMA int4 kernel beside it). On the 82M-class random model (bench/harness/random_llama.py, whose 330 MB of fp32 weights do not
fit in cache): batch-1 decode ratios to fp32 per wall second and per CPU second, three interleaved
rounds.

KV cache modes (``kv_cache_dtype`` auto | int8, fp32 weights; fp8 KV needs CUDA): sequences at full
context in the same ``kv_cache_bytes`` (capacity), greedy agreement with the ``auto`` cache on short and on
~900-token prompts, perplexity and the retrieval probe with K/V rounded as the cache stores them
(``QuantizedKVDense``), and decode tokens/s at batch 1, 32 (short prompts) and 8 (long prompts).

    python -m bench.bench_quant [--quick] [--only weights|kv]

Writes bench/results/quant.json; docs/quantization.md holds the numbers and what to ship for what.
"""
from __future__ import annotations

import argparse
import math
import os
import random
import sys
import time
from pathlib import Path

import torch

from tokenizers import Tokenizer

from backend.attention.dense import DenseCausalAttention
from backend.config import EngineConfig
from backend.core.kv_quant import KVFormat, dequantize_into, kv_format, quantize_per_token_head
from backend.engine.llm_engine import LLMEngine, output_token_ids
from backend.model.loader import load_model
from backend.model.quant import quantize_model
from bench.harness.report import git_commit, machine, write_json
from bench.harness.workload import corpus_ids
from contracts.sampling_params import SamplingParams
from bench.harness.random_llama import make as make_random_llama

ROOT = Path(__file__).resolve().parents[1]
MODES = ("none", "int8", "int4")
KV_MODES = ("auto", "int8")


class QuantizedKVDense(DenseCausalAttention):
    """Dense causal attention over K/V rounded through a KV format per token and head, as the paged cache
    stores and reads them (queries stay exact): perplexity and the probe of a quantized KV cache."""

    def __init__(self, fmt: KVFormat, batch_size: int, seq_len: int):
        super().__init__(batch_size, seq_len)
        self.fmt = fmt

    def forward(self, layer_idx, q, k, v):
        # q: [num_tokens, num_heads, head_dim]; k, v: [num_tokens, num_kv_heads, head_dim]
        k, v = (dequantize_into(torch.empty_like(x), *quantize_per_token_head(x, self.fmt)) for x in (k, v))
        return super().forward(layer_idx, q, k, v)


class PerBlockScaleKVDense(DenseCausalAttention):
    """The alternative not built: one int8 scale per (block of ``block_size`` positions, head), the block's
    max over its tokens. Dense only (perplexity, probe), to measure what per-token scales buy."""

    def __init__(self, block_size: int, batch_size: int, seq_len: int):
        super().__init__(batch_size, seq_len)
        self.block_size = block_size

    def forward(self, layer_idx, q, k, v):
        # q: [num_tokens, num_heads, head_dim]; k, v: [num_tokens, num_kv_heads, head_dim] (one sequence from 0)
        n, bs = k.shape[0], self.block_size
        out = []
        for x in (k, v):
            pad = torch.nn.functional.pad(x, (0, 0, 0, 0, 0, -n % bs)).view(-1, bs, *x.shape[1:])  # [nb, bs, H, D]
            scale = (pad.abs().amax(dim=(1, 3), keepdim=True) / 127).clamp_min(2.0 ** -14).half().float()
            out.append((torch.floor(pad / scale + 0.5).clamp(-127, 127) * scale).view(-1, *x.shape[1:])[:n])
        return super().forward(layer_idx, q, *out)


def dense_attention(kv: str = "auto"):
    """``n -> attention backend`` for one sequence of n tokens, with K/V as ``kv`` stores them."""
    if kv == "auto":
        return lambda n: DenseCausalAttention(1, n)
    fmt = kv_format(kv, torch.float32)
    return lambda n: QuantizedKVDense(fmt, 1, n)


@torch.inference_mode()
def token_logprobs(model, ids: list[int], attention=None) -> torch.Tensor:   # [len(ids) - 1]: log p(ids[i+1] | ..)
    attn = (attention or dense_attention())(len(ids))
    hidden = model(torch.tensor(ids), torch.arange(len(ids)), attn)
    lp = model.compute_logits(hidden[:-1]).log_softmax(-1)
    return lp.gather(1, torch.tensor(ids[1:])[:, None]).squeeze(1)


def perplexity(model, ids: list[int], window: int = 256, attention=None) -> float:
    total, n = 0.0, 0
    for s in range(0, len(ids) - window, window):
        lp = token_logprobs(model, ids[s:s + window], attention)
        total += float(lp.sum())
        n += lp.numel()
    return math.exp(-total / n)


def retrieval_probe(model, tok: Tokenizer, filler: list[int], n: int = 8, attention=None) -> float:
    """Mean log-prob per token of a planted fact when it is quoted again at the end of a ~900-token prompt."""
    rng, scores = random.Random(5), []
    for i in range(n):
        fact = tok.encode(f'API_KEY = "{rng.getrandbits(40):010x}"\n', add_special_tokens=False).ids
        start = rng.randrange(0, len(filler) - 900)
        body = filler[start:start + 850]
        ids = [0] + fact + body + fact
        lp = token_logprobs(model, ids, attention)
        scores.append(float(lp[-len(fact):].mean()))
    return sum(scores) / len(scores)


def greedy_agreement(engines: dict, prompts: list[list[int]], n_tokens: int = 32, base: str = "none") -> dict:
    params = SamplingParams(max_tokens=n_tokens, temperature=0.0, ignore_eos=True)
    outs = {m: [output_token_ids(o) for o in e.generate(prompts, params)] for m, e in engines.items()}
    res = {}
    for m, o in outs.items():
        first = sum(a[0] == b[0] for a, b in zip(o, outs[base])) / len(o)
        prefix = [next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), len(a)) for a, b in zip(o, outs[base])]
        res[m] = {"first_token_agreement": first, "mean_identical_prefix": sum(prefix) / len(prefix)}
    return res


def tok_per_s(engine: LLMEngine, prompts: list[list[int]], batch: int, tokens: int) -> float:
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    engine.generate(prompts[:batch], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    t = time.perf_counter()
    engine.generate(prompts[:batch], params)
    return batch * tokens / (time.perf_counter() - t)


def bench_kv(model_path: str, tok: Tokenizer, ids: list[int], heldout: list[int], prompts: list[list[int]],
             quick: bool) -> dict:
    """Each KV cache mode against ``auto`` (fp32 here) with fp32 weights, in one run."""
    model = load_model(model_path)
    engines = {kv: LLMEngine(EngineConfig.from_settings(model_path=model_path, kv_cache_dtype=kv, device="cpu",
                                                        cpu_threads=1))
               for kv in KV_MODES}
    rng = random.Random(11)
    long_prompts = [[0] + ids[s:s + 900] for s in (rng.randrange(0, len(ids) - 1000) for _ in range(4 if quick else 8))]
    short = greedy_agreement(engines, prompts[:16 if quick else 64], base="auto")
    long = greedy_agreement(engines, long_prompts, base="auto")
    per_block = lambda n: PerBlockScaleKVDense(16, 1, n)
    rows_extra = {"int8_per_block_head_scale (dense only)": {
        "perplexity": perplexity(model, heldout, attention=per_block),
        "retrieval_logprob": retrieval_probe(model, tok, ids, 4 if quick else 8, per_block)}}
    rows, base_ppl, base_blocks = {}, None, None
    for kv, eng in engines.items():
        ppl = perplexity(model, heldout, attention=dense_attention(kv))
        base_ppl = base_ppl or ppl
        blocks = eng.stats().kv_blocks_max
        base_blocks = base_blocks or blocks
        per_seq = -(-eng.scheduler.max_model_len // eng.config.cache.block_size)
        row = {"kv_blocks": blocks, "capacity_ratio": blocks / base_blocks,
               "sequences_at_full_context": blocks // per_seq,
               "kv_bytes_per_token": eng.runner.kv_cache.nbytes // (blocks * eng.config.cache.block_size),
               "perplexity": ppl, "perplexity_delta_pct": 100 * (ppl / base_ppl - 1),
               **short[kv], "long_first_token_agreement": long[kv]["first_token_agreement"],
               "long_mean_identical_prefix": long[kv]["mean_identical_prefix"],
               "retrieval_logprob": retrieval_probe(model, tok, ids, 4 if quick else 8, dense_attention(kv))}
        rows[kv] = row
    speeds = {"tok_per_s_b1": lambda e: tok_per_s(e, prompts, 1, 64 if quick else 128),
              "tok_per_s_b32": lambda e: tok_per_s(e, prompts, 32, 32 if quick else 64),
              "tok_per_s_b8_long": lambda e: tok_per_s(e, long_prompts * 2, 8, 16 if quick else 32)}
    for _ in range(2 if quick else 3):   # modes alternate, best of the rounds: a ratio robust to a busy machine
        for name, measure in speeds.items():
            for kv, eng in engines.items():
                rows[kv][name] = max(rows[kv].get(name, 0.0), measure(eng))
    for kv, row in rows.items():
        row.update({f"{name}_ratio": row[name] / rows["auto"][name] for name in speeds})
        print(f"KV {kv:5s} blocks {row['kv_blocks']} (x{row['capacity_ratio']:.2f}, {row['sequences_at_full_context']} "
              f"seqs at full context, {row['kv_bytes_per_token']} B/token)  ppl {row['perplexity']:7.3f} "
              f"({row['perplexity_delta_pct']:+.2f}%)  first-token agree {row['first_token_agreement']:.2f}  "
              f"identical prefix {row['mean_identical_prefix']:.1f}  long: {row['long_first_token_agreement']:.2f} / "
              f"{row['long_mean_identical_prefix']:.1f}  retrieval {row['retrieval_logprob']:.3f}  "
              f"b1 {row['tok_per_s_b1']:.0f} (x{row['tok_per_s_b1_ratio']:.2f})  b32 {row['tok_per_s_b32']:.0f} "
              f"(x{row['tok_per_s_b32_ratio']:.2f})  b8 long {row['tok_per_s_b8_long']:.0f} "
              f"(x{row['tok_per_s_b8_long_ratio']:.2f}) tok/s", flush=True)
    for name, row in rows_extra.items():
        row["perplexity_delta_pct"] = 100 * (row["perplexity"] / base_ppl - 1)
        print(f"KV {name}: ppl {row['perplexity']:7.3f} ({row['perplexity_delta_pct']:+.2f}%)  retrieval "
              f"{row['retrieval_logprob']:.3f}", flush=True)
    for eng in engines.values():
        eng.shutdown()
    return {**rows, **rows_extra}


@torch.inference_mode()
def layer_us(out_f: int = 2048, in_f: int = 768, copies: int = 24, reps: int = 20) -> dict:
    """One token through a 2048 x 768 layer, weights out of cache (24 copies in turn): CPU us per layer."""
    from backend.model.quant import QuantLinear, native_ops_for
    native = native_ops_for(torch.device("cpu"))
    lins = [torch.nn.Linear(in_f, out_f, bias=False) for _ in range(copies)]
    x = torch.randn(1, in_f)
    layers = {"none": [lambda lin=lin: torch.nn.functional.linear(x, lin.weight) for lin in lins]}
    for mode in ("int8", "int4"):
        qs = [QuantLinear.from_linear(lin, mode, 64, {}, native) for lin in lins]
        layers[mode] = [lambda q=q: q.forward(x) for q in qs]
    if native is not None:      # the few-token int4 kernel, exact dequantize-and-FMA (QuantLinear takes the GEMM)
        layers["int4 (a)"] = [lambda q=q: native.quant_gemv_int4(x, q.qweight, q.scale, None, None) for q in qs]
    res = {}
    for mode, fns in layers.items():
        for f in fns:
            f()
        t = time.thread_time()
        for _ in range(reps):
            for f in fns:
                f()
        res[mode] = (time.thread_time() - t) / reps / copies * 1e6
    return res


def decode_rates(engine: LLMEngine, prompt: list[int], tokens: int) -> tuple[float, float]:
    """Batch-1 decode steps only: (tokens per wall second, tokens per CPU second of this process), from the
    difference between generating 4 and 4 + ``tokens`` tokens (the prefill cancels out)."""
    spent = []
    for n in (4, 4 + tokens):
        params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
        wall, cpu = time.perf_counter(), time.process_time()
        engine.generate([prompt], params)
        spent.append((time.perf_counter() - wall, time.process_time() - cpu))
    return tokens / (spent[1][0] - spent[0][0]), tokens / (spent[1][1] - spent[0][1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(ROOT / "models/demo-target"))
    ap.add_argument("--big", default=str(ROOT / ".cache/models/random-82m"))
    ap.add_argument("--group", type=int, default=64)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", choices=("all", "weights", "kv"), default="all",
                    help="weights: the weight modes; kv: the KV cache modes (bench/results/quant_kv.json)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    load = os.getloadavg()
    tok = Tokenizer.from_file(str(Path(args.model) / "tokenizer.json"))
    ids = corpus_ids(tok, 30000)
    heldout = ids[:4096 if args.quick else 16384]
    rng = random.Random(3)
    prompts = [[0] + ids[s:s + rng.randint(16, 128)] for s in (rng.randrange(0, len(ids) - 200) for _ in range(64))]
    result: dict = {"demo": {}, "big": {}}
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    if args.only != "weights":
        result["kv"] = bench_kv(args.model, tok, ids, heldout, prompts, args.quick)
        if args.only == "kv":
            write_json(out / "quant_kv.json", {"kv": result["kv"], "machine": machine(load), "commit": git_commit()})
            print(f"wrote {out / 'quant_kv.json'}")
            return 0
    models = {}
    for m in MODES:
        model = load_model(args.model)
        quantize_model(model, m, args.group)
        models[m] = model
    engines = {m: LLMEngine(EngineConfig.from_settings(model_path=args.model, quantization=m,
                                                       quantization_group_size=args.group,
                                                       device="cpu", cpu_threads=1)) for m in MODES}
    agree = greedy_agreement(engines, prompts[:16 if args.quick else 64])
    base_ppl = None
    for m in MODES:
        ppl = perplexity(models[m], heldout)
        base_ppl = base_ppl or ppl
        row = {"perplexity": ppl, "perplexity_delta_pct": 100 * (ppl / base_ppl - 1), **agree[m],
               "retrieval_logprob": retrieval_probe(models[m], tok, ids, 4 if args.quick else 8),
               "tok_per_s_b1": tok_per_s(engines[m], prompts, 1, 64 if args.quick else 128),
               "tok_per_s_b32": tok_per_s(engines[m], prompts, 32, 32 if args.quick else 64),
               "kv_blocks": engines[m].stats().kv_blocks_max}
        result["demo"][m] = row
        print(f"demo {m:5s} ppl {ppl:7.3f} ({row['perplexity_delta_pct']:+.2f}%)  first-token agree "
              f"{row['first_token_agreement']:.2f}  identical prefix {row['mean_identical_prefix']:.1f}  "
              f"retrieval {row['retrieval_logprob']:.3f}  b1 {row['tok_per_s_b1']:.0f} tok/s  "
              f"b32 {row['tok_per_s_b32']:.0f} tok/s  KV blocks {row['kv_blocks']}", flush=True)
    from backend.native import native_ops
    build = native_ops()
    result["native_kernels"] = "built" if build.available else build.reason
    result["layer_us"] = layer = layer_us()
    print(f"2048x768 layer, 1 token, out of cache, CPU time (native kernels: {result['native_kernels']}): "
          + "  ".join(f"{m} {us:.0f} us (x{layer['none'] / us:.2f})" for m, us in layer.items()), flush=True)
    big = Path(args.big)
    if not (big / "model.safetensors").is_file():
        make_random_llama(big)
    big_engines = {m: LLMEngine(EngineConfig.from_settings(model_path=str(big), quantization=m,
                                                           quantization_group_size=args.group, device="cpu",
                                                           cpu_threads=1, kv_cache_bytes=64 << 20)) for m in MODES}
    rounds = [{m: decode_rates(e, prompts[0], 32 if args.quick else 64) for m, e in big_engines.items()}
              for _ in range(3)]                    # modes interleaved, three rounds: other jobs hit all alike
    for m in MODES:
        wall = [r[m][0] / r["none"][0] for r in rounds]
        cpu = [r[m][1] / r["none"][1] for r in rounds]
        result["big"][m] = {"tok_per_s_b1": [r[m][0] for r in rounds], "ratio": wall,
                            "tok_per_cpu_s_b1": [r[m][1] for r in rounds], "cpu_ratio": cpu}
        print(f"82M  {m:5s} b1 wall x{min(wall):.2f}-{max(wall):.2f}  CPU time x{min(cpu):.2f}-{max(cpu):.2f}  "
              f"({', '.join(f'{r[m][0]:.1f}' for r in rounds)} tok/s; "
              f"{', '.join(f'{r[m][1]:.1f}' for r in rounds)} tok per CPU s)", flush=True)
    write_json(out / "quant.json", {**result, "machine": machine(load), "commit": git_commit(),
                                    "group_size": args.group})
    print(f"wrote {out / 'quant.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
