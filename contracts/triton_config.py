"""Reading a Triton model's ``config.pbtxt`` (as the JSON Triton hands ``initialize``).

Parameters are strings (``{"string_value": ...}``); an empty value means "use the default".
Checkpoint and tokenizer paths may be relative to the repository root, never to the server's
working directory. Every error names the parameter. A model refuses every parameter it does not read
(``check_known_parameters``), naming the model, and names our equivalent of another server's parameter.
"""
from __future__ import annotations

import difflib
from pathlib import Path
from typing import Iterable, Mapping

from contracts.foreign_parameters import foreign_answer

REPO = Path(__file__).resolve().parents[1]
PATH_PARAMETERS = ("model_path", "draft_model_path", "tokenizer_path", "lora_dir")
DEFAULT_TOKENIZER = "models/demo-target"     # the committed demo model (its folder holds the tokenizer)
# read by Triton's Python backend itself (python_be.cc), allowed in every model
TRITON_PARAMETERS = ("EXECUTION_ENV_PATH", "FORCE_CPU_ONLY_INPUT_TENSORS")


def model_parameters(model_config: dict) -> dict[str, str]:
    """``parameters`` of a Triton model config as a plain {key: string_value} dict."""
    return {k: (v or {}).get("string_value", "") for k, v in (model_config.get("parameters") or {}).items()}


def check_known_parameters(model: str, params: Mapping[str, object], known: Iterable[str]) -> None:
    """Refuse the parameters of ``model`` that are neither in ``known`` nor ``TRITON_PARAMETERS``: a
    ``ValueError`` naming each one and the model, with our equivalent of another server's name
    (contracts/foreign_parameters.py) or the near-miss it may be a typo of."""
    allowed = set(known) | set(TRITON_PARAMETERS)
    unknown = sorted(k for k in params if k not in allowed)
    if unknown:
        raise ValueError("; ".join(unknown_parameter_message(model, k, allowed) for k in unknown))


def unknown_parameter_message(model: str, key: str, known: Iterable[str]) -> str:
    """``key: not a parameter of the MODEL model (HINT)``."""
    hint = foreign_answer(key, model)
    if hint is None:
        close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.75)
        hint = f"did you mean {close[0]!r}?" if close else "each model's parameters: docs/deploy.md"
    return f"{key}: not a parameter of the {model} model ({hint})"


def resolve_path(value: str, root: Path = REPO) -> Path:
    """A checkpoint path: absolute as given, relative to the repository root otherwise."""
    path = Path(value)
    return path if path.is_absolute() else root / path


def resolve_paths(params: dict[str, str], root: Path = REPO) -> dict[str, str]:
    """``params`` with every non-empty path parameter made absolute (``resolve_path``)."""
    out = dict(params)
    for key in PATH_PARAMETERS:
        if out.get(key):
            out[key] = str(resolve_path(out[key], root))
    return out


def str_param(params: dict[str, str], key: str, default: str) -> str:
    return params.get(key) or default


def int_param(params: dict[str, str], key: str, default: int | None) -> int | None:
    raw = params.get(key) or ""
    if not raw.strip():
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{key}: expected an integer parameter, got {raw!r}") from None


def positive_float_param(params: dict[str, str], key: str, default: float) -> float:
    raw = params.get(key) or ""
    if not raw.strip():
        return default
    try:
        x = float(raw)
    except ValueError:
        raise ValueError(f"{key}: expected a number, got {raw!r}") from None
    if not x > 0:
        raise ValueError(f"{key}: must be > 0, got {raw!r}")
    return x
