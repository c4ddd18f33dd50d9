"""The countable house rules: a short README, reference docs, no history in the tracked files, modules of a
readable size, a lean bench/ that runs as ``python -m``."""
from __future__ import annotations

import ast
import re
import subprocess

from tests.repo.code_tree import REPO, product_files, tracked

# Built from parts so that this file does not match its own search.
HISTORY = "|".join(["sess" + "ion [0-9]", "this sess" + "ion", "device " + "time", "is " + "lent",
                    "other " + "engineers"])
MAX_MODULE_LINES = 400
MAX_DOCSTRING_LINES = 30


def lines(path: str) -> int:
    return len((REPO / path).read_text().splitlines())


def test_readme_is_short():
    assert lines("README.md") <= 150


def test_benchmarks_doc_is_reference_sized():
    assert lines("docs/benchmarks.md") <= 400


def test_tracked_files_do_not_speak_of_work_periods():
    found = subprocess.run(["git", "grep", "-nIiE", HISTORY, "--", "."], cwd=REPO, capture_output=True,
                           text=True).stdout
    assert not found, found


def test_no_product_module_over_the_limit():
    long = {p: lines(p) for p in product_files() if lines(p) > MAX_MODULE_LINES}
    assert not long, long


def test_no_docstring_over_the_limit():
    long = []
    for path in product_files():
        for node in ast.walk(ast.parse((REPO / path).read_text(), path)):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node, clean=False)
                if doc and len(doc.splitlines()) > MAX_DOCSTRING_LINES:
                    long.append(f"{path}:{getattr(node, 'name', '<module>')} ({len(doc.splitlines())} lines)")
    assert not long, long


def test_bench_top_level_is_lean():
    top = [p for p in tracked("bench/*") if p.count("/") == 1]
    assert len(top) <= 12, top


def test_bench_and_tools_do_not_edit_sys_path():
    edits = [f"{p}:{n}" for p in tracked("*.py") if p.startswith(("bench/", "tools/"))
             for n, line in enumerate((REPO / p).read_text().splitlines(), 1)
             if re.search(r"sys\.path\s*(\.(insert|append|extend)|\[.*\]\s*=|\s*=|\s*\+=)", line)]
    assert not edits, edits
