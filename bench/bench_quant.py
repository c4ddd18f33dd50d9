"""Quantization acceptance numbers: each weight mode against the unquantized model, in one run.

On the demo target: held-out perplexity and its delta, greedy agreement (share of identical first
tokens and mean identical prefix over held-out prompts, 32 tokens each), a long-context retrieval
probe (the mean log-probability of a fact planted early in a ~900-token prompt, re-quoted at the end),
and decode tokens/s at batch 1 and 32. One 2048 x 768 layer at one token, weights out of cache: CPU
microseconds of this thread per call (robust to other jobs on a shared machine; the native int8/int4
kernels when built; "int4 (a)": the exact dequantize-and-FMA int4 kernel beside design (b), which int4
uses). On the 82M-class random model (tools/make_random_llama.py, whose 330 MB of fp32 weights do not
fit in cache): batch-1 decode ratios to fp32 per wall second and per CPU second, three interleaved
rounds. KV-cache quantization is not built, so KV capacity is the same in every mode (reported).

    .venv/bin/python bench/bench_quant.py [--quick]

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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tokenizers import Tokenizer  # noqa: E402

from backend.attention.dense import DenseCausalAttention  # noqa: E402
from backend.config import EngineConfig  # noqa: E402
from backend.engine.llm_engine import LLMEngine, output_token_ids  # noqa: E402
from backend.model.loader import load_model  # noqa: E402
from backend.model.quant import quantize_model  # noqa: E402
from bench.report import git_commit, machine, write_json  # noqa: E402
from bench.workload import corpus_ids  # noqa: E402
from contracts.sampling_params import SamplingParams  # noqa: E402
from tools.make_random_llama import make as make_random_llama  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MODES = ("none", "int8", "int4")


@torch.inference_mode()
def token_logprobs(model, ids: list[int]) -> torch.Tensor:   # [len(ids) - 1]: log p(ids[i+1] | ids[:i+1])
    hidden = model(torch.tensor(ids), torch.arange(len(ids)), DenseCausalAttention(1, len(ids)))
    lp = model.compute_logits(hidden[:-1]).log_softmax(-1)
    return lp.gather(1, torch.tensor(ids[1:])[:, None]).squeeze(1)


def perplexity(model, ids: list[int], window: int = 256) -> float:
    total, n = 0.0, 0
    for s in range(0, len(ids) - window, window):
        lp = token_logprobs(model, ids[s:s + window])
        total += float(lp.sum())
        n += lp.numel()
    return math.exp(-total / n)


def retrieval_probe(model, tok: Tokenizer, filler: list[int], n: int = 8) -> float:
    """Mean log-prob per token of a planted fact when it is quoted again at the end of a ~900-token prompt."""
    rng, scores = random.Random(5), []
    for i in range(n):
        fact = tok.encode(f'API_KEY = "{rng.getrandbits(40):010x}"\n', add_special_tokens=False).ids
        start = rng.randrange(0, len(filler) - 900)
        body = filler[start:start + 850]
        ids = [0] + fact + body + fact
        lp = token_logprobs(model, ids)
        scores.append(float(lp[-len(fact):].mean()))
    return sum(scores) / len(scores)


def greedy_agreement(engines: dict, prompts: list[list[int]], n_tokens: int = 32) -> dict:
    params = SamplingParams(max_tokens=n_tokens, temperature=0.0, ignore_eos=True)
    outs = {m: [output_token_ids(o) for o in e.generate(prompts, params)] for m, e in engines.items()}
    res = {}
    for m, o in outs.items():
        first = sum(a[0] == b[0] for a, b in zip(o, outs["none"])) / len(o)
        prefix = [next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), len(a)) for a, b in zip(o, outs["none"])]
        res[m] = {"first_token_agreement": first, "mean_identical_prefix": sum(prefix) / len(prefix)}
    return res


def tok_per_s(engine: LLMEngine, prompts: list[list[int]], batch: int, tokens: int) -> float:
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    engine.generate(prompts[:batch], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    t = time.perf_counter()
    engine.generate(prompts[:batch], params)
    return batch * tokens / (time.perf_counter() - t)


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
    if native is not None:      # int4 design (a), exact dequantize-and-FMA (QuantLinear calls (b) at group 64)
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
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    load = os.getloadavg()
    tok = Tokenizer.from_file(str(Path(args.model) / "tokenizer.json"))
    ids = corpus_ids(tok, 30000)
    heldout = ids[:4096 if args.quick else 16384]
    rng = random.Random(3)
    prompts = [[0] + ids[s:s + rng.randint(16, 128)] for s in (rng.randrange(0, len(ids) - 200) for _ in range(64))]
    result: dict = {"demo": {}, "big": {}}
    models = {}
    for m in MODES:
        model = load_model(args.model)
        quantize_model(model, m, args.group)
        models[m] = model
    engines = {m: LLMEngine(EngineConfig(model_path=args.model, quantization=m, quantization_group_size=args.group,
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
    big_engines = {m: LLMEngine(EngineConfig(model_path=str(big), quantization=m, quantization_group_size=args.group,
                                             device="cpu", cpu_threads=1, kv_cache_bytes=64 << 20)) for m in MODES}
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
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "quant.json", {**result, "machine": machine(load), "commit": git_commit(),
                                    "group_size": args.group})
    print(f"wrote {out / 'quant.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
