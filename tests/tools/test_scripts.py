"""bench/ and tools/ scripts run as ``python -m ...`` from the repository root: their usage lines say so, and
the profiling scripts import nothing from ``bench`` (sys.path edits and the bench/ file count: tests/repo)."""
from __future__ import annotations

import ast
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


@pytest.mark.parametrize("path", sorted((REPO / "tools" / "profile").glob("*.py")), ids=rel)
def test_profiling_scripts_import_nothing_from_bench(path):
    for node in ast.walk(ast.parse(path.read_text())):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        assert not any(n == "bench" or n.startswith("bench.") for n in names), f"{rel(path)} imports {names}"
