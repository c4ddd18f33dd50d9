"""The repository's tracked Python modules and their imports, parsed (never imported) for the layout tests."""
from __future__ import annotations

import ast
import subprocess
from dataclasses import dataclass
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NOT_PRODUCT = ("tests/", "models/")


@cache
def tracked(pattern: str = "*.py") -> tuple[str, ...]:
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", pattern], cwd=REPO,
                         capture_output=True, text=True, check=True).stdout
    return tuple(sorted(p for p in out.split() if (REPO / p).is_file()))


def product_files() -> tuple[str, ...]:
    """Every tracked Python file outside the tests and the demo models' folders."""
    return tuple(p for p in tracked() if not p.startswith(NOT_PRODUCT))


def module_name(path: str) -> str:
    name = path[:-3].replace("/", ".")
    return name[: -len(".__init__")] if name.endswith(".__init__") else name


@dataclass(frozen=True)
class Import:
    source: str   # the importing module
    target: str   # the project module it names (the longest prefix that is one of ours)
    line: int


def _is_package(path: str) -> bool:
    return path.endswith("__init__.py")


def imported_names(path: str) -> list[tuple[str, int]]:
    """``(dotted name, line)`` of every import statement in ``path`` (a tracked file): module level, inside
    functions and under ``TYPE_CHECKING`` alike; ``from pkg import name`` gives ``pkg.name``, relative imports
    resolved."""
    source = module_name(path)
    found = []
    for node in ast.walk(ast.parse((REPO / path).read_text(), path)):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = source.split(".") if _is_package(path) else source.split(".")[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join(package + ([base] if base else []))
            found += [(f"{base}.{a.name}", node.lineno) for a in node.names]
    return found


@cache
def imports() -> tuple[Import, ...]:
    """Every import statement of every product module that names a product module: module level, inside
    functions and under ``TYPE_CHECKING`` alike. ``from pkg import name`` counts as an import of ``pkg.name``
    when that is a module, else of ``pkg``."""
    files = product_files()
    modules = {module_name(p): p for p in files}

    def ours(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    found = []
    for path in files:
        source = module_name(path)
        for name, line in imported_names(path):
            target = ours(name)
            if target is not None and target != source:
                found.append(Import(source, target, line))
    return tuple(found)


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    result = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    result.append(sorted(component))
    return result
