"""Reading a Triton model's ``config.pbtxt`` (as the JSON Triton hands ``initialize``).

Parameters are strings (``{"string_value": ...}``); an empty value means "use the default".
Checkpoint and tokenizer paths may be relative to the repository root, never to the server's
working directory. Every error names the parameter.
"""
from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PATH_PARAMETERS = ("model_path", "draft_model_path", "tokenizer_path", "lora_dir")
DEFAULT_TOKENIZER = "models/demo-target"     # the committed demo model (its folder holds the tokenizer)


def model_parameters(model_config: dict) -> dict[str, str]:
    """``parameters`` of a Triton model config as a plain {key: string_value} dict."""
    return {k: (v or {}).get("string_value", "") for k, v in (model_config.get("parameters") or {}).items()}


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
