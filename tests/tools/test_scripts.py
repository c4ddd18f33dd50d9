"""bench/ and tools/ scripts run as ``python -m ...`` from the repository root: no ``sys.path`` edits, usage
lines that say ``python -m``, and the profiling scripts import nothing from ``bench``."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(p for d in ("bench", "tools") for p in (REPO / d).rglob("*.py") if "__pycache__" not in p.parts)


def rel(path: Path) -> str:
    return str(path.relative_to(REPO))


def edits_sys_path(tree: ast.AST) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name) \
                and node.value.id == "sys":
            return True
    return False


@pytest.mark.parametrize("path", SCRIPTS, ids=rel)
def test_no_sys_path_edits(path):
    assert not edits_sys_path(ast.parse(path.read_text())), f"{rel(path)} touches sys.path"


@pytest.mark.parametrize("path", SCRIPTS, ids=rel)
def test_usage_lines_say_python_m(path):
    text = path.read_text()
    module = rel(path)[:-3].replace("/", ".")
    assert f"python {rel(path)}" not in text and f"python3 {rel(path)}" not in text, \
        f"{rel(path)}: run it as python -m {module}"


def test_the_bench_top_level_stays_small():
    tracked = [p for p in (REPO / "bench").iterdir() if p.name not in ("__pycache__", "results", "harness")]
    assert len(tracked) <= 12, sorted(p.name for p in tracked)


@pytest.mark.parametrize("path", sorted((REPO / "tools" / "profile").glob("*.py")), ids=rel)
def test_profiling_scripts_import_nothing_from_bench(path):
    for node in ast.walk(ast.parse(path.read_text())):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        assert not any(n == "bench" or n.startswith("bench.") for n in names), f"{rel(path)} imports {names}"
