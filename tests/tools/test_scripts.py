"""bench/ and tools/ scripts run as ``python -m ...`` from the repository root: their usage lines say so
(sys.path edits, the bench/ file count and which layer may import which: tests/repo)."""
from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(p for d in ("bench", "tools") for p in (REPO / d).rglob("*.py") if "__pycache__" not in p.parts)


def rel(path: Path) -> str:
    return str(path.relative_to(REPO))


@pytest.mark.parametrize("path", SCRIPTS, ids=rel)
def test_usage_lines_say_python_m(path):
    text = path.read_text()
    module = rel(path)[:-3].replace("/", ".")
    assert f"python {rel(path)}" not in text and f"python3 {rel(path)}" not in text, \
        f"{rel(path)}: run it as python -m {module}"
