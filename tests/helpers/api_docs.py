"""Read what docs/api.md and model_repository/ensemble/config.pbtxt say, for the docs checks."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
API_MD = REPO / "docs" / "api.md"
ENSEMBLE_CONFIG = REPO / "model_repository" / "ensemble" / "config.pbtxt"
TRITON_TYPES = {"TYPE_STRING": "BYTES", "TYPE_INT32": "INT32", "TYPE_UINT64": "UINT64", "TYPE_FP32": "FP32",
                "TYPE_BOOL": "BOOL", "TYPE_INT64": "INT64", "TYPE_FP16": "FP16"}


@dataclass(frozen=True)
class Tensor:
    name: str
    type: str          # BYTES, INT32, ...
    is_list: bool      # dims [-1] (or a matrix: dims [-1, -1], [-1, 3])


def config_tensors(section: str, path: Path = ENSEMBLE_CONFIG) -> dict[str, Tensor]:
    """The ``input`` or ``output`` entries of a config.pbtxt."""
    text = path.read_text()
    body = re.search(rf"^{section} \[(.*?)^\]", text, re.S | re.M).group(1)
    out = {}
    for m in re.finditer(r'name:\s*"(\w+)"\s+data_type:\s*(\w+)\s+dims:\s*\[\s*(-?\d+)\s*(,\s*-?\d+\s*)?\]', body):
        out[m.group(1)] = Tensor(m.group(1), TRITON_TYPES[m.group(2)], m.group(3) == "-1")
    return out


def section_table(heading: str, path: Path = API_MD) -> list[list[str]]:
    """Rows (cells, stripped) of the first table under ``## heading``."""
    text = path.read_text()
    m = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    if m is None:
        raise AssertionError(f"{path.name} has no section '## {heading}'")
    rows, started = [], False
    for line in m.group(1).splitlines():
        if line.startswith("|"):
            started = True
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
            if set("".join(cells)) <= set("- :"):
                continue
            rows.append(cells)
        elif started:
            break
    return rows[1:]   # without the header


def documented_names(cell: str) -> list[str]:
    """``"`a`, `b`"`` -> ``["a", "b"]``."""
    return re.findall(r"`(\w+)`", cell)


def documented_types(cell: str) -> list[str]:
    return re.findall(r"\b(BYTES|INT32|UINT64|FP32|FP16|BOOL|INT64)\b", cell)


@dataclass(frozen=True)
class Example:
    inputs: dict
    error: str | None              # the message the stream's error contains
    num_output_tokens: int | None
    finish_reason: str | None
    empty: bool = False            # the answer is one empty final response


def examples(path: Path = API_MD) -> list[Example]:
    out = []
    for inputs_cell, answer in section_table("Examples", path):
        inputs = json.loads(inputs_cell.strip("`"))
        m = re.fullmatch(r"error `(.*)`", answer)
        if m:
            out.append(Example(inputs, m.group(1), None, None))
            continue
        if answer.startswith("an empty final response"):
            out.append(Example(inputs, None, None, None, empty=True))
            continue
        n = re.search(r"(\d+) output tokens", answer)
        reason = re.search(r"`finish_reason` `(\w+)`", answer)
        if not (n or reason):
            raise AssertionError(f"api.md example answer not understood: {answer!r}")
        out.append(Example(inputs, None, int(n.group(1)) if n else None, reason.group(1) if reason else None))
    return out
