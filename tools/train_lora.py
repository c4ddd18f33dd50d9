"""Train a PEFT LoRA adapter for a base checkpoint on the torch-source corpus, on the CPU (the demo adapter).

    .venv/bin/python -m tools.train_lora --base models/demo-target --out models/demo-lora/torch-style \\
        [--rank 8] [--alpha 16] [--targets q_proj,k_proj,v_proj,o_proj] [--steps N | --minutes 6] \\
        [--threads 1] [--seed 0]

The corpus (``bench.harness.corpus.torch_corpus_files``) is every ``*.py`` of the installed torch package's ``nn``,
``optim`` and ``distributions`` sub-packages: code in another style than the stdlib the demo models learnt
(``nn.Module`` subclasses, ``forward(self, x)``, ``torch.*`` calls). 5% of its files, chosen by a hash of their
path inside the package, are held out and never trained on. The files are tokenized with the base's tokenizer
and packed end to end as the base's training packs them (``tools.training.encode_files``); each step draws
random windows from a generator seeded by ``--seed``.

The model is HF transformers' Llama with ``peft``'s LoRA on the target projections, the base frozen. The
adapter is written by ``PeftModel.save_pretrained`` (``adapter_config.json`` + ``adapter_model.safetensors``;
the model card it adds is left out) beside ``training_stats.json``: steps, minutes, the training loss at the
start and the end, the held-out loss of the base and of the adapter. The step count comes from ``--steps``, or
from the speed of the first 20 steps and ``--minutes``, and is printed so that a run can be repeated exactly;
the learning rate warms up, then follows ``tools.train_model.lr_at``'s cosine to 10%.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from bench.harness.corpus import TORCH_HELDOUT_PERCENT, TORCH_PACKAGES, torch_corpus_files
from tools.train_model import batch_at, heldout_loss, lr_at
from tools.training import add_run_arguments, encode_corpus, seeded

DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
RATE_STEPS = 20   # steps timed before ``minutes`` becomes a step count
END_STEPS = 20    # the training loss at the end: the mean over this many last steps


def causal_lm_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of an HF causal LM; ``x``, ``y`` [batch, seq] token ids."""
    logits = model(input_ids=x).logits          # [batch, seq, vocab]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def lora_model(base: Path, rank: int, alpha: float, targets: tuple[str, ...]) -> torch.nn.Module:
    """The base checkpoint under a fresh PEFT LoRA (``lora_A`` drawn from torch's generator, ``lora_B`` zero)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    return get_peft_model(model, LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(targets),
                                            lora_dropout=0.0, bias="none", task_type="CAUSAL_LM"))


def fit(model: torch.nn.Module, trainable: list[torch.nn.Parameter], train: np.ndarray, rng: np.random.Generator, *,
        steps: int, minutes: float, lr: float, batch: int, seq_len: int, warmup: int) -> list[float]:
    """The training loop (AdamW on ``trainable``, gradients clipped to 1): ``steps``, or as many as ``minutes``
    allow at the speed of the first ``RATE_STEPS``; returns each step's training loss."""
    opt = torch.optim.AdamW(trainable, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    total = steps or 10**9
    losses: list[float] = []
    t0 = time.time()
    model.train()
    step = 0
    while step < total:
        x, y = batch_at(train, rng.integers(0, len(train) - seq_len - 1, size=batch), seq_len)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, total, lr, warmup)
        loss = causal_lm_loss(model, x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        opt.step()
        losses.append(loss.item())
        step += 1
        if step == RATE_STEPS and not steps:
            total = max(RATE_STEPS, int(RATE_STEPS / (time.time() - t0) * minutes * 60))
            print(f"{RATE_STEPS / (time.time() - t0):.2f} steps/s -> {total} steps; rerun with --steps {total}",
                  flush=True)
        if step % 50 == 0 or step == total:
            print(f"step {step}/{total} loss {losses[-1]:.3f} {(time.time() - t0) / 60:.1f} min", flush=True)
    return losses


def train_adapter(base: str | Path, out: str | Path, *, rank: int = 8, alpha: float = 16.0,
                  targets: tuple[str, ...] = DEFAULT_TARGETS, steps: int = 0, minutes: float = 6.0,
                  threads: int = 1, seed: int = 0, lr: float = 3e-3, batch: int = 16, seq_len: int = 256,
                  warmup: int = 20, heldout_tokens: int = 0) -> dict:
    """Train, write the adapter and ``training_stats.json`` under ``out``; returns the stats.
    ``steps`` 0: as many as ``minutes`` allow; ``heldout_tokens`` 0: the whole held-out split."""
    if rank < 1 or alpha <= 0 or steps < 0 or minutes <= 0 or threads < 1 or batch < 1 or seq_len < 2:
        raise ValueError("rank, alpha, minutes, threads and batch must be positive, steps >= 0, seq_len >= 2")
    base, out = Path(base), Path(out)
    rng = seeded(seed, threads)
    _, corpus = encode_corpus(base, torch_corpus_files())
    train, heldout = corpus.train, corpus.heldout[:heldout_tokens + 1] if heldout_tokens else corpus.heldout
    print(f"train tokens {len(train):,} from {corpus.train_files} files; held-out {len(heldout):,} "
          f"from {corpus.heldout_files} files", flush=True)

    model = lora_model(base, rank, alpha, targets)
    trainable = [p for p in model.parameters() if p.requires_grad]
    t0 = time.time()
    losses = fit(model, trainable, train, rng, steps=steps, minutes=minutes, lr=lr, batch=batch, seq_len=seq_len,
                 warmup=warmup)
    elapsed = time.time() - t0

    ho_adapter = heldout_loss(model, heldout, seq_len, loss_fn=causal_lm_loss)
    with model.disable_adapter():
        ho_base = heldout_loss(model, heldout, seq_len, loss_fn=causal_lm_loss)
    model.save_pretrained(str(out))
    (out / "README.md").unlink(missing_ok=True)   # PEFT's model card template: nothing of this run in it
    stats = {
        "base": str(base), "rank": rank, "alpha": alpha, "targets": list(targets),
        "adapter_parameters": sum(p.numel() for p in trainable),
        "corpus": {"packages": [f"torch/{p}" for p in TORCH_PACKAGES], "torch_version": torch.__version__,
                   "heldout_percent": TORCH_HELDOUT_PERCENT, "train_files": corpus.train_files,
                   "heldout_files": corpus.heldout_files, "train_tokens": int(len(train)),
                   "heldout_tokens": int(len(heldout))},
        "steps": len(losses), "training_minutes": elapsed / 60, "threads": threads, "batch": batch,
        "seq_len": seq_len, "tokens_seen": len(losses) * batch * seq_len, "peak_lr": lr, "warmup": warmup,
        "seed": seed, "train_loss_start": losses[0], "train_loss_end": float(np.mean(losses[-END_STEPS:])),
        "heldout_loss_base": ho_base, "heldout_loss_adapter": ho_adapter,
    }
    (out / "training_stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    return stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", type=Path, required=True, help="the base checkpoint's folder (HF format)")
    ap.add_argument("--out", type=Path, required=True, help="the adapter's folder")
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--alpha", type=float, default=16.0)
    ap.add_argument("--targets", default=",".join(DEFAULT_TARGETS), help="comma-separated projections")
    ap.add_argument("--steps", type=int, default=0, help="0: as many as --minutes allow")
    ap.add_argument("--minutes", type=float, default=6.0)
    add_run_arguments(ap, batch=16, lr=3e-3, seed=0, threads=1)
    ap.add_argument("--heldout-tokens", type=int, default=0, help="0: the whole held-out split")
    a = ap.parse_args()
    stats = train_adapter(a.base, a.out, rank=a.rank, alpha=a.alpha, targets=tuple(a.targets.split(",")),
                          steps=a.steps, minutes=a.minutes, threads=a.threads, seed=a.seed, lr=a.lr,
                          batch=a.batch, seq_len=a.seq_len, heldout_tokens=a.heldout_tokens)
    print(json.dumps(stats, indent=2), flush=True)


if __name__ == "__main__":
    main()
