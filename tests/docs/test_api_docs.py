"""The docs match the server: every ensemble input and output has its row in docs/api.md with the type
config.pbtxt gives it (and no row names a tensor the ensemble lacks); the examples parse; every relative
link in the Markdown resolves inside the repository."""
from __future__ import annotations

import re

import pytest

from tests.helpers.api_docs import REPO, config_tensors, documented_names, documented_types, examples, section_table


def table_tensors(heading: str) -> dict[str, list[str]]:
    """name -> documented types, from the first column (names) and second column (types) of a table."""
    out = {}
    for row in section_table(heading):
        names, types = documented_names(row[0]), documented_types(row[1])
        for i, name in enumerate(names):
            out[name] = types[i] if len(types) == len(names) else (types[0] if types else None)
    return out


@pytest.mark.parametrize("section,heading", [("input", "Inputs"), ("output", "Outputs")])
def test_every_ensemble_tensor_has_a_row_with_its_type(section, heading):
    config = config_tensors(section)
    documented = table_tensors(heading)
    if section == "output":   # the speculative-decoding outputs have their own table
        documented.update(table_tensors("Speculative-decoding outputs (TensorRT-LLM's names)"))
    missing = sorted(set(config) - set(documented))
    assert not missing, f"docs/api.md has no row for the ensemble {section}s {missing}"
    extra = sorted(set(documented) - set(config))
    assert not extra, f"docs/api.md documents {section}s the ensemble does not have: {extra}"
    wrong = {n: (documented[n], t.type) for n, t in config.items() if documented[n] != t.type}
    assert not wrong, f"documented type != config.pbtxt type: {wrong}"


def test_list_inputs_are_documented_as_lists():
    rows = {n: row for row in section_table("Inputs") for n in documented_names(row[0])}
    for name, t in config_tensors("input").items():
        if t.is_list:
            assert "list" in rows[name][1], f"{name} has dims [-1]: its type cell should say 'list'"


def test_examples_parse_and_use_only_ensemble_inputs():
    inputs = config_tensors("input")
    exs = examples()
    assert len(exs) >= 8
    for ex in exs:
        assert set(ex.inputs) <= set(inputs), ex.inputs


MARKDOWN = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md"), *REPO.glob("*/README.md")])


@pytest.mark.parametrize("path", MARKDOWN, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_stay_inside_the_repository(path):
    text = path.read_text()
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+://|mailto:|#", target):
            continue
        resolved = (path.parent / target.split("#")[0]).resolve()
        assert resolved.is_relative_to(REPO), f"{path.name}: link {target!r} points outside the repository"
        assert resolved.exists(), f"{path.name}: link {target!r} points to nothing"
    assert "../shared" not in text, f"{path.name} refers to a file outside the repository"
