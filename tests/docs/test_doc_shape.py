"""The docs stay reference a newcomer can use: one results table of at most 12 rows whose commands name real
benchmark modules and flags, and every repository path a doc names exists. (Sizes and the search for work
periods over every tracked file: tests/repo/test_house_rules.py.)"""
from __future__ import annotations

import re

import pytest

from tests.helpers.api_docs import REPO

README = REPO / "README.md"
PATH = re.compile(r"(?<![A-Za-z0-9_./-])((?:backend|preprocess|postprocess|contracts|gateway|tools|bench|proto|helm|"
                  r"tests|cli|grammar|tracing)/[A-Za-z0-9_./-]+\.(?:py|proto|yaml|md|sh))")
DOCS = sorted([README, *(REPO / "docs").glob("*.md"), REPO / "helm" / "README.md",
               *(REPO / "proto").rglob("*.proto")])


def results_rows() -> list[list[str]]:
    text = README.read_text()
    section = text[text.index("## Results"):]
    rows = [[c.strip() for c in line.strip().split("|")[1:-1]] for line in section.splitlines()
            if line.startswith("|")]
    return [r for r in rows[1:] if not set("".join(r)) <= set("- :")]


def test_one_results_table_of_short_cells():
    rows = results_rows()
    assert 1 <= len(rows) <= 12, len(rows)
    for row in rows:
        assert len(row) == 3, row
        for cell in row:
            assert len(cell) <= 120, f"{len(cell)} characters: {cell}"


def test_results_commands_name_benchmark_modules_and_their_flags():
    previous = None
    for what, _, command in results_rows():
        if command == "the same":
            assert previous is not None, what
            continue
        m = re.fullmatch(r"`([a-z_]+)\.([a-z_]+)((?: [^`]*)?)`", command)
        assert m, f"{what}: the command cell should be `package.module --flags`: {command}"
        source = REPO / m.group(1) / f"{m.group(2)}.py"
        assert source.is_file(), f"{what}: {source.relative_to(REPO)} does not exist"
        code = source.read_text()
        for flag in re.findall(r"(--[a-z0-9-]+)", m.group(3)):
            assert f'"{flag}"' in code, f"{what}: {source.name} has no flag {flag}"
        previous = command


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_no_missing_paths(path):
    text = path.read_text()
    missing = sorted({p for p in PATH.findall(text) if not (REPO / p).exists()})
    assert not missing, f"{path.name} names paths that do not exist: {missing}"
