"""Imports follow the layer table of docs/engine-design.md, no module imports itself back through others, no two
packages import each other, and nothing outside tests/ imports ``tests``.

The table is read from the doc (section "Layers": one row per layer, top first, its packages in backticks);
a module belongs to the row of the longest package prefix that names it, and that prefix is its package. An
import may point to its own row or any row below, never up; function-level and ``TYPE_CHECKING`` imports count
like the others.
"""
from __future__ import annotations

import re
from collections import defaultdict

import pytest

from tests.repo.code_tree import REPO, cycles, imported_names, imports, module_name, product_files, tracked

DOC = REPO / "docs" / "engine-design.md"


def layer_table() -> dict[str, int]:
    """Package prefix -> row (0 = top), from the doc's "Layers" table."""
    text = DOC.read_text()
    match = re.search(r"^## Layers\n(.*?)(?=^## )", text, re.S | re.M)
    assert match, "docs/engine-design.md has no '## Layers' section"
    rows = [line for line in match.group(1).splitlines() if line.startswith("|")][2:]   # past header and rule
    table = {}
    for row, line in enumerate(rows):
        cells = [c.strip() for c in line.strip("|").split("|")]
        for prefix in re.findall(r"`([A-Za-z_][\w.]*)`", cells[1]):
            assert prefix not in table, f"{prefix} is in two rows of the layer table"
            table[prefix] = row
    assert len(rows) >= 5 and table, "the layer table has too few rows to mean anything"
    return table


def prefix_of(module: str, table: dict[str, int]) -> str | None:
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in table:
            return ".".join(parts[:n])
    return None


def test_every_product_module_has_a_layer():
    table = layer_table()
    missing = sorted(m for m in map(module_name, product_files()) if prefix_of(m, table) is None)
    assert not missing, f"modules in no row of the layer table: {missing}"


def test_imports_point_down_the_layer_table():
    table = layer_table()
    upward = []
    for imp in imports():
        src, dst = prefix_of(imp.source, table), prefix_of(imp.target, table)
        if src is not None and dst is not None and table[dst] < table[src]:
            upward.append(f"{imp.source}:{imp.line} imports {imp.target} ({src} row {table[src] + 1} -> "
                          f"{dst} row {table[dst] + 1})")
    assert not upward, "imports up the layer table:\n" + "\n".join(upward)


def test_no_import_cycles():
    edges: dict[str, set[str]] = defaultdict(set)
    for imp in imports():
        edges[imp.source].add(imp.target)
    found = cycles(edges)
    assert not found, f"import cycles: {found}"


def package_cycles() -> list[list[str]]:
    """Groups of packages (layer-table prefixes) that import each other, directly or through others."""
    table = layer_table()
    edges: dict[str, set[str]] = defaultdict(set)
    for imp in imports():
        src, dst = prefix_of(imp.source, table), prefix_of(imp.target, table)
        if src is not None and dst is not None and src != dst:
            edges[src].add(dst)
    return cycles(edges)


def test_no_two_packages_import_each_other():
    found = package_cycles()
    assert not found, f"packages that import each other: {found}"


def test_nothing_outside_tests_imports_tests():
    found = [f"{path}:{line} imports {name}" for path in tracked() if not path.startswith("tests/")
             for name, line in imported_names(path) if name == "tests" or name.startswith("tests.")]
    assert not found, "modules outside tests/ that import tests:\n" + "\n".join(found)


@pytest.mark.parametrize("edges, expected", [
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
    ({"a": {"b"}, "b": set()}, []),
    ({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c"}}, [["a", "b"], ["c", "d"]]),
])
def test_cycle_finder(edges, expected):
    assert sorted(cycles(edges)) == expected


def test_function_level_imports_are_seen():
    """The parser reads imports inside functions (the awq/gptq kind of cycle hides there)."""
    sources = {(i.source, i.target) for i in imports()}
    assert ("cli.serve", "cli.gateway_process") in sources   # imported inside a function in cli/serve.py
