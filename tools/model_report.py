"""Measure the demo models and write docs/demo-model.md.

    python -m tools.model_report [--target models/demo-target] [--draft models/demo-draft]

Reports parameters, tokens seen, training time (from training_stats.json), held-out
perplexity of both models, how faithfully each continues a span repeated from earlier in its context
(what prompt-lookup speculation relies on), how often the draft's greedy next token equals the target's on
held-out code (a predictor of speculative speed-up), and greedy continuations of held-out
function headers.
"""
from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

from backend.attention.dense import DenseCausalAttention
from backend.model.loader import load_model
from bench.harness.corpus import corpus_files, read_text
from tools.train_model import heldout_copy_accuracy

WINDOW = 256


@torch.no_grad()
def window_logits(model, ids: np.ndarray) -> torch.Tensor:
    """Logits ``[num_windows * WINDOW, vocab]`` over consecutive windows of ``ids``."""
    n = (len(ids) - 1) // WINDOW
    x = torch.from_numpy(ids[:n * WINDOW].astype(np.int64)).view(n, WINDOW)
    out = []
    for i in range(0, n, 16):
        xb = x[i:i + 16]
        hidden = model(xb.reshape(-1), torch.arange(WINDOW).repeat(xb.shape[0]), DenseCausalAttention(*xb.shape))
        out.append(model.compute_logits(hidden))
    return torch.cat(out)


def heldout_ids(tok: Tokenizer) -> np.ndarray:
    _, heldout = corpus_files(include_tests=False)
    eos = tok.token_to_id("<|eos|>")
    ids: list[int] = []
    for f in heldout:
        text = read_text(f)
        if text:
            ids += tok.encode(text).ids + [eos]
    return np.asarray(ids, dtype=np.int64)


def function_headers(n: int) -> list[str]:
    """One top-level function header from each of the first ``n`` held-out files that have one.

    The prompt stops after the colon: BPE merges a newline with the indentation that follows, so a
    prompt ending in a bare newline would be an unnatural token boundary.
    """
    _, heldout = corpus_files(include_tests=False)
    heads = []
    for f in heldout:
        m = re.search(r"^def \w+\(.*\):$", read_text(f) or "", re.MULTILINE)
        if m:
            heads.append(m.group(0))
            if len(heads) == n:
                break
    return heads


@torch.no_grad()
def greedy(model, tok: Tokenizer, prompt: str, n: int) -> str:
    ids = tok.encode(prompt).ids
    for _ in range(n):
        t = torch.tensor(ids)
        logits = model.compute_logits(model(t, torch.arange(len(ids)), DenseCausalAttention(1, len(ids)))[-1:])
        ids.append(int(logits.argmax()))
    return tok.decode(ids[len(tok.encode(prompt).ids):], skip_special_tokens=False)


def training_note(target_stats: dict) -> str:
    """The target's training stages from its ``training_stats.json`` runs (``tools/train_model.py``)."""
    stages = []
    for i, r in enumerate(target_stats.get("runs", [])):
        what = f"{r['steps']} steps " + ("from scratch" if i == 0 else "more")
        what += f" at {r.get('seq_len', 256)} tokens, peak LR {r['peak_lr']:g}"
        if r.get("copy_fraction"):
            lo, hi = r["copy_span"]
            what += (f", {100 * r['copy_fraction']:.0f}% of the rows repeating one of their own spans of {lo} to {hi}"
                     f" tokens (`--copy-fraction`)")
        stages.append(what)
    return (f"The target trains in {len(stages)} stages ({'; '.join(stages)}), each on a fresh data order; the "
            "numbers below are totals. AdamW, cosine schedule, 8,192 tokens a batch.")


def distillation_note(draft_stats: dict) -> list[str]:
    """A paragraph on the draft's distillation runs (``tools/distill_draft.py``), if it had any."""
    runs = [r for r in draft_stats.get("runs", []) if r.get("kind") == "distill"]
    if not runs:
        return []
    lines = []
    for i, r in enumerate(runs):
        lead = "The draft was then distilled from the target" if i == 0 else \
            f"Distillation run {i + 1} continued from that draft"
        if i and abs(r["heldout_agreement_before"] - runs[i - 1]["heldout_agreement_after"]) > 1e-3:
            lead += (f" after the target had been trained further (agreement "
                     f"{100 * runs[i - 1]['heldout_agreement_after']:.1f}% with the old target)")
        head = (f"{lead} (`tools/distill_draft.py`): {r['steps']} steps "
                f"({r['tokens_seen'] / 1e6:.1f}M tokens, {r['training_minutes']:.0f} min, "
                f"{'one thread' if r.get('threads', 1) == 1 else str(r['threads']) + ' threads'}, "
                f"peak learning rate {r['peak_lr']:g}) of")
        loss = (f"KL(target || draft) at temperature {r['temperature']:g} on the training split, the target's "
                "logits computed on the fly;")
        agree = (f"held-out greedy agreement {100 * r['heldout_agreement_before']:.1f}% before, "
                 f"{100 * r['heldout_agreement_after']:.1f}% after.")
        lines += [head, loss, agree, ""]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--target", type=Path, default=Path("models/demo-target"))
    ap.add_argument("--draft", type=Path, default=Path("models/demo-draft"))
    ap.add_argument("--out", type=Path, default=Path("docs/demo-model.md"))
    args = ap.parse_args()
    tok = Tokenizer.from_file(str(args.target / "tokenizer.json"))
    ids = heldout_ids(tok)
    target, draft = load_model(args.target), load_model(args.draft)
    y = torch.from_numpy(ids[1:((len(ids) - 1) // WINDOW) * WINDOW + 1])
    lt, ld = window_logits(target, ids), window_logits(draft, ids)
    ppl_t = math.exp(F.cross_entropy(lt, y).item())
    ppl_d = math.exp(F.cross_entropy(ld, y).item())
    agree = (lt.argmax(-1) == ld.argmax(-1)).float().mean().item()
    stats = {k: json.loads((p / "training_stats.json").read_text()) for k, p in
             (("target", args.target), ("draft", args.draft))}
    samples = [(h, greedy(target, tok, h, 48)) for h in function_headers(3)]
    lines = ["# The demo models", "",
             "Trained by `tools/train_demo.sh` on the CPU (2 cores) on the Python standard library source of the",
             "running interpreter (Python 3.11); 2% of the non-test files, chosen by a stable hash of their path,",
             "are held out and never trained on. Byte-level BPE tokenizer (vocab 4096, digits split), shared.",
             training_note(stats["target"]), ""]
    lines += distillation_note(stats["draft"])
    lines += ["| | target | draft |", "| --- | --- | --- |"]
    cfgs = {k: json.loads((p / "config.json").read_text()) for k, p in (("target", args.target), ("draft", args.draft))}
    rows = [
        ("parameters", lambda k: f"{stats[k]['parameters'] / 1e6:.2f}M"),
        ("layers x hidden (heads / KV heads)", lambda k: f"{cfgs[k]['num_hidden_layers']} x {cfgs[k]['hidden_size']} "
                                                        f"({cfgs[k]['num_attention_heads']} / {cfgs[k]['num_key_value_heads']})"),
        ("tokens seen", lambda k: f"{stats[k]['tokens_seen'] / 1e6:.1f}M ({stats[k]['epochs']:.2f} epochs)"),
        ("training time", lambda k: f"{stats[k]['training_minutes']:.0f} min"),
    ]
    for name, fn in rows:
        lines.append(f"| {name} | {fn('target')} | {fn('draft')} |")
    lines.append(f"| held-out loss, 256-token windows (this report) | {math.log(ppl_t):.3f} | {math.log(ppl_d):.3f} |")
    lines.append(f"| held-out perplexity (this report) | {ppl_t:.2f} | {ppl_d:.2f} |")
    copy = {k: heldout_copy_accuracy(m, ids, 512, (8, 128)) for k, m in (("target", target), ("draft", draft))}
    lines.append(f"| held-out copy accuracy (512-token windows, a repeated span of 8 to 128 tokens) | "
                 f"{100 * copy['target']:.1f}% | {100 * copy['draft']:.1f}% |")
    agreement = (f"Draft greedy token equals target greedy token on {100 * agree:.1f}% of held-out positions "
                 f"({len(y):,} positions).")
    lines += ["", agreement, "", "## Greedy continuations of held-out function headers (target, 48 tokens)", ""]
    for head, cont in samples:
        lines += ["```python", head + cont, "```", ""]
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
