"""The demo model's corpus: the running interpreter's standard library source.

Files are split into train and held-out by a stable hash of their path relative
to the stdlib root, so the split is the same on every machine with that Python.
"""
from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path

HELDOUT_PERCENT = 2
TEST_DIRS = {"test", "tests", "idle_test"}


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def is_heldout(rel_path: str) -> bool:
    digest = hashlib.sha1(rel_path.encode()).digest()
    return int.from_bytes(digest[:4], "big") % 100 < HELDOUT_PERCENT


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


def read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None
