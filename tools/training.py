"""What the demo models' training scripts share (tools/train_model.py, tools/distill_draft.py, tools/train_lora.py):
the run's common flags and their checks, the repeated-span setting, seeding, and a corpus encoded by a tokenizer."""
from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer

from bench.harness.corpus import read_text


def add_run_arguments(ap: argparse.ArgumentParser, *, batch: int, lr: float, seed: int, threads: int) -> None:
    """``--seq-len`` (256), ``--batch``, ``--lr``, ``--seed``, ``--threads`` with the script's defaults."""
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=batch)
    ap.add_argument("--lr", type=float, default=lr)
    ap.add_argument("--seed", type=int, default=seed)
    ap.add_argument("--threads", type=int, default=threads)


def add_copy_arguments(ap: argparse.ArgumentParser, fraction_help: str) -> None:
    """``--copy-fraction`` (0: plain windows) and ``--copy-span`` ("min,max", 8,128): rows with a repeated span."""
    ap.add_argument("--copy-fraction", type=float, default=0.0, help=fraction_help)
    ap.add_argument("--copy-span", default="8,128", help="min,max length of a repeated span")


def copy_span(fraction: float, span: str) -> tuple[int, int]:
    """The checked ``--copy-span``; ``ValueError`` naming both flags when it or ``--copy-fraction`` is out of range."""
    bounds = tuple(int(v) for v in span.split(","))
    if not 0.0 <= fraction <= 1.0 or len(bounds) != 2 or not 2 <= bounds[0] <= bounds[1]:
        raise ValueError("--copy-fraction must be in [0, 1] and --copy-span 'min,max' with 2 <= min <= max")
    return bounds


def check_positive(**values: float | None) -> None:
    """``ValueError`` naming the first flag whose value is not positive (None: not given, not checked)."""
    for name, value in values.items():
        if value is not None and value <= 0:
            raise ValueError(f"--{name.replace('_', '-')} must be positive")


def seeded(seed: int, threads: int) -> np.random.Generator:
    """Seed torch, set its threads, and return the run's numpy generator (batch starts, spans)."""
    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    return np.random.default_rng(seed)


def encode_files(tok: Tokenizer, files) -> np.ndarray:
    """Each file is ``<|bos|> text <|eos|>``; all files end to end as uint16 ids."""
    eos = tok.token_to_id("<|eos|>")
    texts = [t for t in (read_text(f) for f in files) if t]
    ids: list[int] = []
    for enc in tok.encode_batch(texts):
        ids.extend(enc.ids)
        ids.append(eos)
    return np.asarray(ids, dtype=np.uint16)


@dataclass(frozen=True)
class EncodedCorpus:
    train: np.ndarray          # uint16 ids, every training file end to end
    heldout: np.ndarray        # uint16 ids, every held-out file
    train_files: int
    heldout_files: int


def encode_corpus(tokenizer: Path, files: tuple[Sequence[Path], Sequence[Path]]) -> tuple[Tokenizer, EncodedCorpus]:
    """The tokenizer of a folder (``tokenizer.json``) and a corpus's ``(train, heldout)`` files encoded by it."""
    tok = Tokenizer.from_file(str(tokenizer / "tokenizer.json"))
    train_files, heldout_files = files
    return tok, EncodedCorpus(encode_files(tok, train_files), encode_files(tok, heldout_files), len(train_files),
                              len(heldout_files))
