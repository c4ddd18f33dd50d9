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
from tools.corpus import corpus_files, read_text

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


def encode_files(tok: Tokenizer, files) -> np.ndarray:
    """Each file is ``<|bos|> text <|eos|>``; all files end to end as uint16 ids."""
    eos = tok.token_to_id("<|eos|>")
    texts = [t for t in (read_text(f) for f in files) if t]
    ids: list[int] = []
    for enc in tok.encode_batch(texts):
        ids.extend(enc.ids)
        ids.append(eos)
    return np.asarray(ids, dtype=np.uint16)


def batch_at(data: np.ndarray, starts: np.ndarray, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = np.stack([data[s:s + seq_len + 1] for s in starts]).astype(np.int64)
    x = torch.from_numpy(x)
    return x[:, :-1], x[:, 1:]


def loss_on(model: LlamaForCausalLM, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    b, s = x.shape
    pos = torch.arange(s).repeat(b)
    hidden = model(x.reshape(-1), pos, DenseCausalAttention(b, s))
    return F.cross_entropy(model.compute_logits(hidden), y.reshape(-1))


@torch.no_grad()
def heldout_loss(model: LlamaForCausalLM, data: np.ndarray, seq_len: int, batch: int = 16) -> float:
    """Mean next-token loss over consecutive non-overlapping windows of the held-out ids."""
    model.eval()
    n = (len(data) - 1) // seq_len
    starts = np.arange(n) * seq_len
    total, count = 0.0, 0
    for i in range(0, n, batch):
        x, y = batch_at(data, starts[i:i + batch], seq_len)
        total += loss_on(model, x, y).item() * y.numel()
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
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--init-from", type=Path, default=None,
                    help="continue from this HF folder's weights (same size) instead of a random init")
    ap.add_argument("--warmup", type=int, default=100)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(args.seed)

    tok = Tokenizer.from_file(str(args.tokenizer / "tokenizer.json"))
    train_files, heldout_files = corpus_files(include_tests=True)
    train = encode_files(tok, train_files)
    heldout = encode_files(tok, heldout_files)
    print(f"train tokens {len(train):,} from {len(train_files)} files; heldout {len(heldout):,} "
          f"from {len(heldout_files)} files", flush=True)

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
        x, y = batch_at(train, starts, args.seq_len)
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
    save_model(model, args.out, cfg_dict)
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(args.tokenizer / f, args.out / f)
    gen = {"bos_token_id": cfg_dict["bos_token_id"], "eos_token_id": cfg_dict["eos_token_id"],
           "pad_token_id": cfg_dict["pad_token_id"], "do_sample": False}
    (args.out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    runs = prior.get("runs", [{k: prior[k] for k in ("steps", "tokens_seen", "training_minutes", "peak_lr", "seed")
                                if k in prior}] if prior else [])
    runs.append({"steps": step, "tokens_seen": step * tokens_per_step, "training_minutes": elapsed / 60,
                 "peak_lr": args.lr, "seed": args.seed})
    stats = {"size": args.size, "parameters": n_params, "runs": runs,
             "steps": sum(r["steps"] for r in runs), "tokens_seen": sum(r["tokens_seen"] for r in runs),
             "train_tokens": int(len(train)), "heldout_tokens": int(len(heldout)),
             "epochs": sum(r["tokens_seen"] for r in runs) / len(train),
             "training_minutes": sum(r["training_minutes"] for r in runs),
             "heldout_loss": ho, "heldout_perplexity": math.exp(ho), "seq_len": args.seq_len,
             "batch": args.batch, "peak_lr": args.lr, "seed": args.seed}
    (args.out / "training_stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    print(json.dumps(stats, indent=2), flush=True)


if __name__ == "__main__":
    main()
