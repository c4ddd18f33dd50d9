"""Train a demo Llama on the stdlib corpus on the CPU; writes an HF-format folder.

    python -m tools.train_model --size target --tokenizer runs/tok --out models/demo-target --minutes 60

The step count comes from ``--steps``, or from the measured speed of the first
steps and ``--minutes``, and is printed so a run can be repeated exactly. The
learning rate warms up, then follows a cosine to 10% over those steps.
"""
from __future__ import annotations

import argparse
import json
import math
import shutil
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

from backend.attention.dense import DenseCausalAttention
from backend.model.config import ModelConfig
from backend.model.llama import LlamaForCausalLM
from backend.model.loader import load_model, save_model
from bench.harness.corpus import corpus_files
from tools.training import add_copy_arguments, add_run_arguments, copy_span, encode_corpus, seeded

SIZES = {
    # hidden, layers, heads, kv_heads, intermediate
    "target": dict(hidden_size=192, num_hidden_layers=4, num_attention_heads=6, num_key_value_heads=2,
                   intermediate_size=512),
    "draft": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                  intermediate_size=192),
}


def hf_config(size: str, tok: Tokenizer, max_pos: int) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", **SIZES[size],
        "vocab_size": tok.get_vocab_size(), "max_position_embeddings": max_pos, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "rope_scaling": None, "tie_word_embeddings": True, "attention_bias": False,
        "mlp_bias": False, "hidden_act": "silu", "initializer_range": 0.02, "torch_dtype": "float32",
        "bos_token_id": tok.token_to_id("<|bos|>"), "eos_token_id": tok.token_to_id("<|eos|>"),
        "pad_token_id": tok.token_to_id("<|pad|>"), "use_cache": True,
    }


def batch_at(data: np.ndarray, starts: np.ndarray, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = np.stack([data[s:s + seq_len + 1] for s in starts]).astype(np.int64)
    x = torch.from_numpy(x)
    return x[:, :-1], x[:, 1:]


def with_repeated_span(window: np.ndarray, rng: np.random.Generator,
                       span: tuple[int, int]) -> tuple[np.ndarray, int, int]:
    """``window`` with one of its own spans copied in again later, same length: ``w[:b] + w[a:a+L] + w[b:]``
    cut to ``len(window)``, with ``a + L <= b``; returns the row, ``b`` and ``L``. Code repeats itself (imports,
    call patterns, edited copies of a function), and a served model is asked to quote and edit its prompt; these
    rows teach the model to continue a span it has seen, so prompt-lookup speculation meets a model that copies,
    as real LLMs do."""
    n = len(window)
    length = int(rng.integers(span[0], min(span[1], n // 3) + 1))
    a = int(rng.integers(0, n // 2 - length + 1))
    b = int(rng.integers(a + length, n - length + 1))
    return np.concatenate([window[:b], window[a:a + length], window[b:]])[:n], b, length


def batch_with_copies(data: np.ndarray, starts: np.ndarray, seq_len: int, rng: np.random.Generator,
                      copy_fraction: float, span: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch_at``, with a ``copy_fraction`` share of the rows carrying a repeated span (at 0, ``batch_at`` itself,
    drawing nothing from ``rng``: runs without copies keep the data order of the runs before this option)."""
    if copy_fraction <= 0:
        return batch_at(data, starts, seq_len)
    rows = [data[s:s + seq_len + 1] for s in starts]
    rows = [with_repeated_span(r, rng, span)[0] if rng.random() < copy_fraction else r for r in rows]
    x = torch.from_numpy(np.stack(rows).astype(np.int64))
    return x[:, :-1], x[:, 1:]


@torch.no_grad()
def heldout_copy_accuracy(model: LlamaForCausalLM, data: np.ndarray, seq_len: int, span: tuple[int, int],
                          rows: int = 32, seed: int = 0) -> float:
    """Greedy next-token accuracy on the second occurrence of a repeated span in held-out windows (the positions
    a faithful copier gets right), excluding each span's first token (nothing announces the copy before it)."""
    rng = np.random.default_rng(seed)
    model.eval()
    hits = total = 0
    for _ in range(rows):
        s = int(rng.integers(0, len(data) - seq_len - 1))
        row, b, length = with_repeated_span(data[s:s + seq_len + 1], rng, span)
        x = torch.from_numpy(row[:-1].astype(np.int64))[None]
        pred = model.compute_logits(model(x.reshape(-1), torch.arange(x.shape[1]),
                                          DenseCausalAttention(1, x.shape[1]))).argmax(-1)
        # position b + i (inside the copy) predicts the copy's next token row[b + i + 1]
        idx = torch.arange(b, b + length - 1)
        hits += int((pred[idx] == torch.from_numpy(row[idx + 1].astype(np.int64))).sum())
        total += length - 1
    model.train()
    return hits / total


def loss_on(model: LlamaForCausalLM, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    b, s = x.shape
    pos = torch.arange(s).repeat(b)
    hidden = model(x.reshape(-1), pos, DenseCausalAttention(b, s))
    return F.cross_entropy(model.compute_logits(hidden), y.reshape(-1))


@torch.no_grad()
def heldout_loss(model: torch.nn.Module, data: np.ndarray, seq_len: int, batch: int = 16,
                 loss_fn=loss_on) -> float:
    """Mean next-token loss over consecutive non-overlapping windows of the held-out ids; ``loss_fn(model, x, y)``
    is the mean loss of one batch (``loss_on`` for our model)."""
    model.eval()
    n = (len(data) - 1) // seq_len
    starts = np.arange(n) * seq_len
    total, count = 0.0, 0
    for i in range(0, n, batch):
        x, y = batch_at(data, starts[i:i + batch], seq_len)
        total += loss_fn(model, x, y).item() * y.numel()
        count += y.numel()
    model.train()
    return total / count


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    p = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, p))))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--size", choices=sorted(SIZES), required=True)
    ap.add_argument("--tokenizer", type=Path, required=True, help="folder with tokenizer files")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--steps", type=int, default=0)
    add_run_arguments(ap, batch=32, lr=3e-3, seed=0, threads=2)
    ap.add_argument("--init-from", type=Path, default=None,
                    help="continue from this HF folder's weights (same size) instead of a random init")
    ap.add_argument("--warmup", type=int, default=100)
    add_copy_arguments(ap, "share of the rows that carry a repeated span (with_repeated_span); 0 = plain windows")
    args = ap.parse_args()
    span = copy_span(args.copy_fraction, args.copy_span)
    rng = seeded(args.seed, args.threads)

    tok, corpus = encode_corpus(args.tokenizer, corpus_files(include_tests=True))
    train, heldout = corpus.train, corpus.heldout
    print(f"train tokens {len(train):,} from {corpus.train_files} files; heldout {len(heldout):,} "
          f"from {corpus.heldout_files} files", flush=True)

    cfg_dict = hf_config(args.size, tok, max_pos=1024)
    if args.init_from is not None:
        model = load_model(args.init_from).train().requires_grad_(True)
        prior = json.loads((args.init_from / "training_stats.json").read_text())
    else:
        prior = {}
        model = LlamaForCausalLM(ModelConfig.from_dict(cfg_dict))
        for name, p in model.named_parameters():
            if p.dim() == 2:
                torch.nn.init.normal_(p, std=0.02 / (math.sqrt(2 * model.config.num_hidden_layers)
                                                     if name.endswith(("o_proj.weight", "down_proj.weight")) else 1))
    if args.init_from is not None and "heldout_copy_accuracy" not in prior:
        prior["heldout_copy_accuracy"] = heldout_copy_accuracy(model, heldout, args.seq_len, span)
        print(f"held-out copy accuracy of --init-from at seq_len {args.seq_len}: "
              f"{prior['heldout_copy_accuracy']:.3f}", flush=True)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{args.size}: {n_params / 1e6:.2f}M parameters", flush=True)
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), fused=False)

    total, warmup = args.steps or 10**9, args.warmup
    tokens_per_step = args.batch * args.seq_len
    t0 = time.time()
    step = 0
    while step < total:
        starts = rng.integers(0, len(train) - args.seq_len - 1, size=args.batch)
        x, y = batch_with_copies(train, starts, args.seq_len, rng, args.copy_fraction, span)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, total if args.steps or step >= 20 else 10**9, args.lr, warmup)
        loss = loss_on(model, x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step == 20 and not args.steps:
            rate = 20 / (time.time() - t0)
            total = int(rate * args.minutes * 60)
            print(f"measured {rate * tokens_per_step:,.0f} tok/s -> {total} steps "
                  f"({total * tokens_per_step / 1e6:.1f}M tokens); rerun with --steps {total}", flush=True)
        if step % 50 == 0 or step == total:
            el = time.time() - t0
            print(f"step {step}/{total} loss {loss.item():.3f} lr {opt.param_groups[0]['lr']:.2e} "
                  f"{step * tokens_per_step / el:,.0f} tok/s {el / 60:.1f} min", flush=True)
        if step % 1000 == 0:
            save_model(model, args.out.with_name(args.out.name + ".partial"), cfg_dict)
    elapsed = time.time() - t0
    ho = heldout_loss(model, heldout, args.seq_len)
    copy_acc = heldout_copy_accuracy(model, heldout, args.seq_len, span)
    save_model(model, args.out, cfg_dict)
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(args.tokenizer / f, args.out / f)
    gen = {"bos_token_id": cfg_dict["bos_token_id"], "eos_token_id": cfg_dict["eos_token_id"],
           "pad_token_id": cfg_dict["pad_token_id"], "do_sample": False}
    (args.out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    runs = prior.get("runs", [{k: prior[k] for k in ("steps", "tokens_seen", "training_minutes", "peak_lr", "seed")
                                if k in prior}] if prior else [])
    run = {"steps": step, "tokens_seen": step * tokens_per_step, "training_minutes": elapsed / 60,
           "peak_lr": args.lr, "seed": args.seed, "seq_len": args.seq_len}
    if args.copy_fraction:
        run.update(copy_fraction=args.copy_fraction, copy_span=list(span),
                   heldout_copy_accuracy_before=prior.get("heldout_copy_accuracy"))
    runs.append(run)
    stats = {"size": args.size, "parameters": n_params, "runs": runs,
             "steps": sum(r["steps"] for r in runs), "tokens_seen": sum(r["tokens_seen"] for r in runs),
             "train_tokens": int(len(train)), "heldout_tokens": int(len(heldout)),
             "epochs": sum(r["tokens_seen"] for r in runs) / len(train),
             "training_minutes": sum(r["training_minutes"] for r in runs),
             "heldout_loss": ho, "heldout_perplexity": math.exp(ho), "heldout_copy_accuracy": copy_acc,
             "seq_len": args.seq_len,
             "batch": args.batch, "peak_lr": args.lr, "seed": args.seed}
    (args.out / "training_stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    print(json.dumps(stats, indent=2), flush=True)


if __name__ == "__main__":
    main()
