"""Distil the demo draft from the demo target: train it on the target's own next-token distributions.

    python -m tools.distill_draft --target models/demo-target --init models/demo-draft --out runs/draft-distilled \
        --minutes 35 --threads 1        # or --steps N to repeat a run's step count exactly

The loss is the KL divergence from the target's distribution to the draft's at every position of
windows of the training split (``KL(p_target || p_draft)``, at ``--temperature``), plus, with
``--hard-weight``, that weight of cross-entropy to the target's argmax (the token greedy agreement counts),
computed with the target on the fly (the target is small: its forward costs less than the draft's training step).
That is what speculative decoding rewards: the draft should predict what the *target* will say, not
the corpus. The draft keeps its size and architecture (``--init``'s config.json); the data, split,
batching and schedule are those of ``tools.train_model``. Every ``--eval-every`` steps and at the end
it prints the draft's greedy agreement with the target on the held-out split (the measure
``tools.model_report`` reports), and writes the result, with the run appended to the init's
training_stats.json, to ``--out``.
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

from backend.attention.dense import DenseCausalAttention
from backend.model.llama import LlamaForCausalLM
from backend.model.loader import load_model, save_model
from bench.harness.corpus import corpus_files
from tools.model_report import heldout_ids, window_logits
from tools.train_model import batch_with_copies, heldout_copy_accuracy, heldout_loss, lr_at
from tools.training import (add_copy_arguments, add_run_arguments, check_positive, copy_span, encode_corpus,
                            seeded)

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def logits_on(model: LlamaForCausalLM, x: torch.Tensor) -> torch.Tensor:
    """Logits ``[batch * seq, vocab]`` of ``x`` ``[batch, seq]`` (causal within each row)."""
    b, s = x.shape
    hidden = model(x.reshape(-1), torch.arange(s).repeat(b), DenseCausalAttention(b, s))
    return model.compute_logits(hidden)


def distillation_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Mean over positions of ``KL(softmax(t / T) || softmax(s / T)) * T^2``.

    student_logits, teacher_logits: [num_positions, vocab]
    """
    s = F.log_softmax(student_logits / temperature, dim=-1)
    t = F.log_softmax(teacher_logits / temperature, dim=-1)
    return F.kl_div(s, t, log_target=True, reduction="batchmean") * temperature ** 2


def greedy_agreement(student_logits: torch.Tensor, teacher_argmax: torch.Tensor) -> float:
    """Fraction of positions where the student's argmax equals the teacher's.

    student_logits: [num_positions, vocab]; teacher_argmax: [num_positions]
    """
    return (student_logits.argmax(-1) == teacher_argmax).float().mean().item()


@torch.no_grad()
def heldout_agreement(draft: LlamaForCausalLM, ids: np.ndarray, target_argmax: torch.Tensor) -> float:
    draft.eval()
    agree = greedy_agreement(window_logits(draft, ids), target_argmax)
    draft.train()
    return agree


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--target", type=Path, default=Path("models/demo-target"))
    ap.add_argument("--init", type=Path, default=Path("models/demo-draft"), help="the draft to start from")
    ap.add_argument("--out", type=Path, required=True)
    budget = ap.add_mutually_exclusive_group(required=True)
    budget.add_argument("--steps", type=int, help="train this many steps (cosine schedule over steps)")
    budget.add_argument("--minutes", type=float, help="train this long (cosine schedule over wall time); the step "
                                                       "count reached is printed and recorded")
    add_run_arguments(ap, batch=32, lr=2e-3, seed=2, threads=1)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--hard-weight", type=float, default=0.0,
                    help="add this weight of cross-entropy to the target's argmax (what greedy agreement counts)")
    add_copy_arguments(ap, "share of the rows that carry a repeated span (tools.train_model.with_repeated_span): the "
                           "target copies such spans, and the draft learns to copy them with it; 0 = plain windows")
    ap.add_argument("--eval-every", type=int, default=100)
    args = ap.parse_args()
    check_positive(**{name: getattr(args, name) for name in ("steps", "minutes", "seq_len", "batch", "warmup",
                                                             "threads", "eval_every")})
    if args.temperature <= 0 or args.lr <= 0:
        raise ValueError("--temperature and --lr must be positive")
    if args.hard_weight < 0:
        raise ValueError("--hard-weight must be >= 0")
    span = copy_span(args.copy_fraction, args.copy_span)
    for f in TOKENIZER_FILES:
        if (args.target / f).read_bytes() != (args.init / f).read_bytes():
            raise ValueError(f"--init {args.init} and --target {args.target} differ in {f}: not the same tokenizer")
    rng = seeded(args.seed, args.threads)

    tok, corpus = encode_corpus(args.target, corpus_files(include_tests=True))
    train, heldout = corpus.train, corpus.heldout
    report_ids = heldout_ids(tok)
    target = load_model(args.target).eval().requires_grad_(False)
    target_argmax = window_logits(target, report_ids).argmax(-1)
    draft = load_model(args.init).train().requires_grad_(True)
    cfg_dict = json.loads((args.init / "config.json").read_text())
    prior = json.loads((args.init / "training_stats.json").read_text())
    n_params = sum(p.numel() for p in draft.parameters())
    start_agree = heldout_agreement(draft, report_ids, target_argmax)
    print(f"train tokens {len(train):,}; draft {n_params / 1e6:.2f}M parameters; held-out agreement "
          f"{100 * start_agree:.1f}% at the start ({len(target_argmax):,} positions)", flush=True)

    decay = [p for p in draft.parameters() if p.dim() == 2]
    no_decay = [p for p in draft.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), fused=False)
    tokens_per_step = args.batch * args.seq_len
    t0 = time.time()
    step, last = 0, False
    while not last:
        step += 1
        starts = rng.integers(0, len(train) - args.seq_len - 1, size=args.batch)
        x, _ = batch_with_copies(train, starts, args.seq_len, rng, args.copy_fraction, span)
        if args.steps:
            last = step == args.steps
            lr = lr_at(step - 1, args.steps, args.lr, args.warmup)
        else:
            progress = (time.time() - t0) / (60 * args.minutes)
            last = progress >= 1.0
            lr = lr_at(step - 1, 10**9, args.lr, args.warmup) if step <= args.warmup else \
                lr_at(args.warmup + int(progress * 10**6), args.warmup + 10**6, args.lr, args.warmup)
        for g in opt.param_groups:
            g["lr"] = lr
        with torch.no_grad():
            teacher = logits_on(target, x)
        student = logits_on(draft, x)
        loss = distillation_loss(student, teacher, args.temperature)
        if args.hard_weight:
            loss = loss + args.hard_weight * F.cross_entropy(student, teacher.argmax(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        if step % 25 == 0 or last:
            el = time.time() - t0
            print(f"step {step} loss {loss.item():.3f} batch agreement "
                  f"{100 * greedy_agreement(student.detach(), teacher.argmax(-1)):.1f}% lr {opt.param_groups[0]['lr']:.2e} "
                  f"{step * tokens_per_step / el:,.0f} tok/s {el / 60:.1f} min", flush=True)
        if step % args.eval_every == 0 and not last:
            print(f"step {step} held-out agreement {100 * heldout_agreement(draft, report_ids, target_argmax):.1f}%",
                  flush=True)
    elapsed = time.time() - t0
    agree = heldout_agreement(draft, report_ids, target_argmax)
    ho = heldout_loss(draft, heldout, args.seq_len)
    copy_acc = heldout_copy_accuracy(draft, heldout, args.seq_len, span)
    save_model(draft, args.out, cfg_dict)
    for f in TOKENIZER_FILES + ("generation_config.json",):
        shutil.copy(args.init / f, args.out / f)
    runs = list(prior.get("runs", [{k: prior[k] for k in ("steps", "tokens_seen", "training_minutes", "peak_lr",
                                                             "seed") if k in prior}]))
    runs.append({"kind": "distill", "teacher": str(args.target), "temperature": args.temperature,
                 **({"hard_weight": args.hard_weight} if args.hard_weight else {}),
                 **({"copy_fraction": args.copy_fraction, "copy_span": list(span)} if args.copy_fraction else {}),
                 "seq_len": args.seq_len, "steps": step,
                 "tokens_seen": step * tokens_per_step, "training_minutes": elapsed / 60, "peak_lr": args.lr,
                 "seed": args.seed, "threads": args.threads, "heldout_agreement_before": start_agree,
                 "heldout_agreement_after": agree})
    stats = {**prior, "parameters": n_params, "runs": runs, "steps": sum(r["steps"] for r in runs),
             "tokens_seen": sum(r["tokens_seen"] for r in runs),
             "epochs": sum(r["tokens_seen"] for r in runs) / len(train),
             "training_minutes": sum(r["training_minutes"] for r in runs),
             "heldout_loss": ho, "heldout_perplexity": math.exp(ho), "heldout_agreement": agree,
             "heldout_copy_accuracy": copy_acc}
    (args.out / "training_stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    print(json.dumps(stats, indent=2), flush=True)


if __name__ == "__main__":
    main()
