"""GPU decode check (run on a CUDA machine: `python -m tools.gpu_decode`, about 3 minutes on an H200).

1. Batch-1 decode tokens/s of a 1B-class random Llama (2048 x 16 layers, GQA 32/8, vocab 32,000) in
   bf16 through LLMEngine, against the HBM roofline: each token reads every weight once, so
   tokens/s <= bandwidth / weight bytes. Also batch 8 and 32.
2. The paged decode kernel's achieved bandwidth at an 8,192-token context (K and V bytes read / time),
   for 1 and 16 sequences, against the same HBM bandwidth.
3. The Triton int8/int4 weight-only GEMV (backend/model/quant_triton.py) against bf16 F.linear.
4. Eager vs captured step (``fast_decode``: CUDA graphs per batch bucket, backend/engine/cuda_graph_decode.py),
   and the captured step without the fused elementwise kernels (backend/model/fused.py):
   the logits of one decode step both ways (max abs difference), greedy tokens with capture on and off,
   and decode tokens/s at batch 1, 8 and 32 each way, with the capture time the load line reports.

Prints one line per measurement and writes bench/results/gpu_decode.json. Nothing here runs on CPU.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

from backend.attention.kernels.paged_decode import paged_decode_attention
from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine, output_token_ids
from backend.model.config import ModelConfig
from backend.model.llama import LlamaForCausalLM
from backend.model.loader import save_model
from contracts.sampling_params import SamplingParams

HBM_GBPS = {"H200": 4800.0, "H100": 3350.0, "A100": 2039.0}   # nominal; the device name picks one
CFG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 32000, "hidden_size": 2048,
       "intermediate_size": 5632, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
       "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
       "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu"}


def cuda_seconds(fn, reps: int, warmup: int = 5) -> float:
    """Mean wall time of ``fn`` over ``reps`` calls after ``warmup``, the GPU synchronised around the timed calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / reps


def bandwidth_gbps() -> float:
    name = torch.cuda.get_device_name()
    return next((v for k, v in HBM_GBPS.items() if k in name), 3350.0)


def make_checkpoint(folder: Path) -> int:
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(ModelConfig.from_dict(CFG)).to(torch.bfloat16)
        for p in model.parameters():
            p.data.normal_(0, 0.02)
    save_model(model, folder, CFG, dtype=torch.bfloat16)
    tok_src = Path(__file__).resolve().parents[1] / "models" / "demo-target"
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (folder / f).write_bytes((tok_src / f).read_bytes())   # the engine does not tokenize; any tokenizer file
    return sum(p.numel() * p.element_size() for p in model.parameters())


def engine_decode(folder: Path, weight_bytes: int, out: dict, fast_decode: bool = False, fused: bool = True) -> None:
    # a fixed KV pool (1 MiB a block here): engines built one after another in this process must not size
    # theirs from the memory an earlier one still holds
    os.environ["TRITON_LLM_FUSED"] = "1" if fused else "0"       # read when the engine is built
    eng = LLMEngine(EngineConfig.from_settings(model_path=str(folder), device="cuda", dtype="bfloat16",
                                               fast_decode=fast_decode,
                                               max_num_seqs=64, num_kv_blocks=2048, max_model_len=2048)).start()
    os.environ.pop("TRITON_LLM_FUSED")
    tag = ("captured" if fast_decode else "eager") + ("" if fused else "_unfused")
    print(f"{tag}: {', '.join(eng.parts.summary.rsplit(', ', 2)[-2:])}", flush=True)
    try:
        roof = bandwidth_gbps() * 1e9 / weight_bytes
        for batch in (1, 8, 32):
            prompts = [[1] + list(range(100 + i, 164 + i)) for i in range(batch)]
            params = SamplingParams(max_tokens=256, temperature=0.0, ignore_eos=True)
            eng.generate(prompts, SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True))   # warm-up
            torch.cuda.synchronize()
            t = time.perf_counter()
            eng.generate(prompts, params)
            torch.cuda.synchronize()
            dt = time.perf_counter() - t
            tps = batch * 256 / dt
            out[f"{tag}_decode_b{batch}_tok_per_s"] = tps
            print(f"{tag} decode batch {batch}: {tps:,.0f} tok/s ({dt / 256 * 1e3:.2f} ms/step); "
                  f"batch-1 roofline {roof:,.0f} tok/s -> {tps / batch / roof:.1%} of it per sequence", flush=True)
        out["roofline_tok_per_s"] = roof
    finally:
        eng.shutdown()


def profile_batch1(folder: Path) -> None:
    """Where a captured batch-1 step's time goes on the host: cProfile over 128 steps of an engine stepped on
    this thread (not started), top functions by own time."""
    import cProfile
    import pstats

    eng = LLMEngine(EngineConfig.from_settings(model_path=str(folder), device="cuda", dtype="bfloat16",
                                               fast_decode=True,
                                               max_num_seqs=64, num_kv_blocks=2048, max_model_len=2048))
    eng.generate([[1] + list(range(400, 464))], SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True))
    prof = cProfile.Profile()
    prof.enable()
    eng.generate([[1] + list(range(300, 364))], SamplingParams(max_tokens=128, temperature=0.0, ignore_eos=True))
    prof.disable()
    stats = pstats.Stats(prof)
    stats.sort_stats("tottime").print_stats(18)
    eng.shutdown()


@torch.inference_mode()
def captured_vs_eager(folder: Path, out: dict) -> None:
    """One decode step through the captured graph and through the eager runner (the same K/V slots are
    written both ways), then greedy tokens of a whole generation with capture on and off."""
    kw = {"model_path": str(folder), "device": "cuda", "dtype": "bfloat16", "max_num_seqs": 64,
          "num_kv_blocks": 2048, "max_model_len": 2048}
    prompts = [[1] + list(range(200 + 7 * i, 260 + 7 * i)) for i in range(8)]
    params = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)
    fast_eng = LLMEngine(EngineConfig.from_settings(**kw, fast_decode=True))
    fast = fast_eng.runner.fast_decode
    if fast is None:
        print(f"captured step unavailable: {fast_eng.parts.summary.rsplit(', ', 1)[-1]}", flush=True)
        return
    for i, p in enumerate(prompts):
        fast_eng.add_request(f"c{i}", p, params, lambda o: None)
    fast_eng.step()                                   # prefill (eager)
    plan = fast_eng.scheduler.schedule()
    captured = fast.run(plan).logits.float()
    fast_eng.runner.fast_decode = None
    eager = fast_eng.runner.execute(plan).logits.float()
    fast_eng.runner.fast_decode = fast
    diff = (captured - eager).abs().max().item()
    same_argmax = bool((captured.argmax(-1) == eager.argmax(-1)).all())
    out["captured_vs_eager_max_abs_logit_diff"] = diff
    out["captured_vs_eager_same_argmax"] = same_argmax
    print(f"captured vs eager, one decode step of {len(plan.scheduled)}: max |logit diff| {diff:.3g}, "
          f"same argmax {same_argmax}", flush=True)
    for name, fn in (("captured", lambda: fast.run(plan)), ("eager", lambda: fast_eng.runner.execute(plan))):
        if name == "eager":
            fast_eng.runner.fast_decode = None
        ms = cuda_seconds(fn, 50, warmup=3) * 1e3
        out[f"{name}_forward_b{len(plan.scheduled)}_ms"] = ms
        print(f"{name} forward alone (inputs + model, no scheduling or sampling), batch {len(plan.scheduled)}: "
              f"{ms:.2f} ms", flush=True)
    fast_eng.shutdown()
    # whole generations from fresh engines (no prefix-cache hits from the step above), prefix caching off so
    # both prefill every prompt the same way
    toks = {}
    for fast_on in (False, True):
        eng = LLMEngine(EngineConfig.from_settings(**kw, fast_decode=fast_on, enable_prefix_caching=False))
        toks[fast_on] = [output_token_ids(o) for o in eng.generate(prompts, params)]
        eng.shutdown()
    first = [next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), None) for x, y in zip(toks[True], toks[False])]
    out["captured_vs_eager_same_tokens"] = toks[True] == toks[False]
    out["captured_vs_eager_first_divergence"] = first
    print(f"greedy tokens, capture on vs off: identical {toks[True] == toks[False]} (first divergence per "
          f"sequence, bf16: {first})", flush=True)


def kernel_bandwidth(out: dict) -> None:
    bs, kvh, h, d, ctx = 16, 8, 32, 128, 8192
    for seqs in (1, 16):
        blocks = seqs * ctx // bs
        k = torch.randn(blocks, bs, kvh, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        q = torch.randn(seqs, h, d, device="cuda", dtype=torch.bfloat16)
        tables = torch.arange(blocks, device="cuda", dtype=torch.int32).view(seqs, -1)
        lens = torch.full((seqs,), ctx, device="cuda", dtype=torch.int32)
        for split in (None, 8, 16, 32):
            def fn(split=split):
                return paged_decode_attention(q, k, v, tables, lens, ctx, blocks_per_partition=split)
            dt = cuda_seconds(fn, 50)
            gbps = 2 * k.numel() * k.element_size() / dt / 1e9
            out[f"kernel_seqs{seqs}_split{split}_gbps"] = gbps
            print(f"paged decode kernel, {seqs} x {ctx} tokens, split={split}: {dt * 1e6:.0f} us, {gbps:,.0f} GB/s "
                  f"({gbps / bandwidth_gbps():.0%} of {bandwidth_gbps():,.0f} GB/s)", flush=True)


def quant_gemv(out: dict) -> None:
    """The Triton int8/int4 weight-only GEMV on a 4096 x 4096 bf16 layer, 1 token: error against the
    dequantized matmul and time against bf16 F.linear (weights 32 MB: out of L2)."""
    from backend.model.quant import QuantLinear
    from backend.model.quant_triton import triton_quant_gemv
    lin = torch.nn.Linear(4096, 4096, bias=False, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    for mode in ("int8", "int4"):
        q = QuantLinear.from_linear(lin, mode, 128, {})
        ref = torch.nn.functional.linear(x.float(), q.dequantized().float())
        y = triton_quant_gemv(x, q.qweight, q.scale, q.zeros, None, mode)
        err = float((y.float() - ref).abs().max() / ref.abs().max())
        times = {}
        for name, fn in (("bf16", lambda: torch.nn.functional.linear(x, lin.weight)),
                         (mode, lambda q=q, mode=mode: triton_quant_gemv(x, q.qweight, q.scale, q.zeros, None,
                                                                         mode))):
            times[name] = cuda_seconds(fn, 200)
        out[f"quant_gemv_{mode}"] = {"rel_err": err, "us": times[mode] * 1e6, "bf16_us": times["bf16"] * 1e6}
        print(f"triton {mode} GEMV 4096x4096, 1 token: {times[mode] * 1e6:.1f} us vs bf16 {times['bf16'] * 1e6:.1f} us "
              f"(x{times['bf16'] / times[mode]:.2f}), max rel err {err:.1e}", flush=True)


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args(argv)
    if not torch.cuda.is_available():
        print("python -m tools.gpu_decode needs CUDA")
        return 2
    out: dict = {"device": torch.cuda.get_device_name()}
    kernel_bandwidth(out)
    quant_gemv(out)
    with tempfile.TemporaryDirectory() as tmp:
        weight_bytes = make_checkpoint(Path(tmp))
        out["weight_bytes"] = weight_bytes
        captured_vs_eager(Path(tmp), out)
        for fast_decode, fused in ((False, True), (True, True), (True, False)):   # fused: backend/model/fused.py
            torch.cuda.empty_cache()
            engine_decode(Path(tmp), weight_bytes, out, fast_decode, fused)
        profile_batch1(Path(tmp))
    res = Path(__file__).resolve().parents[1] / "bench" / "results"
    res.mkdir(exist_ok=True)
    (res / "gpu_decode.json").write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
