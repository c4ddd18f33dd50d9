"""The demo models' corpora: the running interpreter's standard library source (the base models), and the
installed ``torch`` package's source (the demo LoRA adapter, code in another style).

Files are split into train and held-out by a stable hash of their path relative
to the corpus root, so the split is the same on every machine with that Python (that torch).
"""
from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path

HELDOUT_PERCENT = 2
TEST_DIRS = {"test", "tests", "idle_test"}
TORCH_PACKAGES = ("nn", "optim", "distributions")   # the sub-packages of torch in the adapter's corpus
TORCH_HELDOUT_PERCENT = 5


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def is_heldout(rel_path: str, percent: int = HELDOUT_PERCENT) -> bool:
    digest = hashlib.sha1(rel_path.encode()).digest()
    return int.from_bytes(digest[:4], "big") % 100 < percent


def corpus_files(include_tests: bool = True) -> tuple[list[Path], list[Path]]:
    """``(train, heldout)``: held-out files come only from non-test folders and are never trained on."""
    root = stdlib_root()
    train, heldout = [], []
    for f in sorted(root.rglob("*.py")):
        parts = f.relative_to(root).parts
        if "site-packages" in parts:
            continue
        is_test = any(p in TEST_DIRS for p in parts)
        rel = "/".join(parts)
        if not is_test and is_heldout(rel):
            heldout.append(f)
        elif not is_test or include_tests:
            train.append(f)
    return train, heldout


def torch_root() -> Path:
    import torch

    return Path(torch.__file__).parent


def torch_corpus_files() -> tuple[list[Path], list[Path]]:
    """``(train, heldout)`` of the adapter's corpus: every ``*.py`` under ``torch/{nn,optim,distributions}``
    (``nn.Module`` subclasses, ``forward(self, x)``, ``torch.*`` calls), ``TORCH_HELDOUT_PERCENT`` of the
    files held out by the hash of their path relative to the torch package (``nn/modules/linear.py``)."""
    root = torch_root()
    train, heldout = [], []
    for package in TORCH_PACKAGES:
        for f in sorted((root / package).rglob("*.py")):
            rel = f.relative_to(root).as_posix()
            (heldout if is_heldout(rel, TORCH_HELDOUT_PERCENT) else train).append(f)
    return train, heldout


def read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None
