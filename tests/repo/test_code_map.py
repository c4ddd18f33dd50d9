"""docs/engine-design.md is the map of the code: every product module is on it exactly once, every path it
names exists, and it refers to nothing outside the repository.

A module is on the map when its full path is written in backticks in the first cell of a row of the
"Modules" section (several paths may share a row). Package ``__init__.py`` files that hold only a docstring
are not modules a reader needs to find.
"""
from __future__ import annotations

import ast
import re
from collections import Counter

from tests.repo.code_tree import REPO, product_files

DOC = REPO / "docs" / "engine-design.md"


def docstring_only(path: str) -> bool:
    body = ast.parse((REPO / path).read_text()).body
    return all(isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) for n in body)


def mapped_paths() -> list[str]:
    text = DOC.read_text()
    match = re.search(r"^## Modules\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert match, "docs/engine-design.md has no '## Modules' section"
    paths = []
    for line in match.group(1).splitlines():
        if line.startswith("|") and not line.startswith("| ---"):
            first = line.strip("|").split("|")[0]
            paths += [p for p in re.findall(r"`([^`]+)`", first) if "/" in p]
    return paths


def expected_modules() -> set[str]:
    return {p for p in product_files() if not (p.endswith("__init__.py") and docstring_only(p))}


def test_every_module_is_on_the_map_once():
    counts = Counter(p for p in mapped_paths() if p.endswith(".py"))
    missing = sorted(expected_modules() - set(counts))
    twice = sorted(p for p, n in counts.items() if n > 1)
    assert not missing, f"modules missing from docs/engine-design.md: {missing}"
    assert not twice, f"modules listed more than once: {twice}"


def test_every_mapped_path_exists():
    gone = sorted(p for p in mapped_paths() if "{" not in p and not (REPO / p).exists())
    assert not gone, f"docs/engine-design.md names paths that do not exist: {gone}"


def test_the_map_refers_to_nothing_outside_the_repository():
    text = DOC.read_text()
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    outside = [t for t in links if t.startswith(("http:", "https:", "/")) or
               not (DOC.parent / t).resolve().is_relative_to(REPO) or not (DOC.parent / t).exists()]
    assert not outside, f"links outside the repository or to nothing: {outside}"
    for phrase in ("../shared", "ARCHITECTURE.md", "shared folder"):
        assert phrase not in text, phrase
