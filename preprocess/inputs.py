"""Typed values out of one Triton request's input arrays (python backend: ``as_numpy()`` results).

Every Triton input arrives as a numpy array, with a batch dimension when the model has
``max_batch_size > 0`` (shape ``[1, ...]``) and without one otherwise. A scalar input may be
shaped ``()``, ``[1]`` or ``[1, 1]``; a list input ``[N]`` or ``[1, N]``. BYTES arrive as object
arrays of ``bytes``. ``None`` (or a missing key) means the optional input was not sent.
Every failure is a ``RequestError`` naming the input.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from preprocess.errors import RequestError

INT32 = (-(2**31), 2**31 - 1)
UINT64 = (0, 2**64 - 1)


def _array(inputs: Mapping[str, Any], name: str) -> np.ndarray | None:
    value = inputs.get(name)
    if value is None:
        return None
    if not isinstance(value, np.ndarray):
        raise RequestError(name, f"expected a numpy array, got {type(value).__name__}")
    return value


def _scalar_item(arr: np.ndarray, name: str):
    if arr.size != 1 or arr.ndim > 2:
        raise RequestError(name, f"expected one value (shape [1] or [1, 1]), got shape {list(arr.shape)}")
    return arr.reshape(-1)[0]


def _decode(item: Any, name: str) -> str:
    if isinstance(item, str):
        return item
    if isinstance(item, (bytes, bytearray, np.bytes_)):
        try:
            return bytes(item).decode("utf-8")
        except UnicodeDecodeError as e:
            raise RequestError(name, f"not valid UTF-8 ({e.reason} at byte {e.start})") from None
    raise RequestError(name, f"expected BYTES, got an element of type {type(item).__name__}")


def _check_bytes_dtype(arr: np.ndarray, name: str) -> None:
    if arr.dtype.kind not in "OSU":
        raise RequestError(name, f"expected BYTES, got dtype {arr.dtype}")


def get_str(inputs: Mapping[str, Any], name: str, default: str | None = None) -> str | None:
    arr = _array(inputs, name)
    if arr is None:
        return default
    _check_bytes_dtype(arr, name)
    return _decode(_scalar_item(arr, name), name)


def get_str_list(inputs: Mapping[str, Any], name: str) -> list[str] | None:
    """A BYTES list: shape ``[N]`` or ``[1, N]`` (a lone ``()`` scalar is a one-element list)."""
    arr = _array(inputs, name)
    if arr is None:
        return None
    _check_bytes_dtype(arr, name)
    if arr.ndim == 2 and arr.shape[0] != 1:
        raise RequestError(name, f"expected shape [N] or [1, N] (batch size 1), got {list(arr.shape)}")
    if arr.ndim > 2:
        raise RequestError(name, f"expected shape [N] or [1, N], got {list(arr.shape)}")
    return [_decode(item, name) for item in arr.reshape(-1)]


def get_bool(inputs: Mapping[str, Any], name: str, default: bool) -> bool:
    arr = _array(inputs, name)
    if arr is None:
        return default
    if arr.dtype.kind != "b":
        raise RequestError(name, f"expected BOOL, got dtype {arr.dtype}")
    return bool(_scalar_item(arr, name))


def get_int(inputs: Mapping[str, Any], name: str, default: int | None,
            bounds: tuple[int, int] = INT32) -> int | None:
    arr = _array(inputs, name)
    if arr is None:
        return default
    if arr.dtype.kind not in "iu":
        raise RequestError(name, f"expected an integer type, got dtype {arr.dtype}")
    value = int(_scalar_item(arr, name))
    lo, hi = bounds
    if not lo <= value <= hi:
        raise RequestError(name, f"must be in [{lo}, {hi}], got {value}")
    return value


def get_float(inputs: Mapping[str, Any], name: str, default: float | None) -> float | None:
    arr = _array(inputs, name)
    if arr is None:
        return default
    if arr.dtype.kind not in "fiu":
        raise RequestError(name, f"expected FP32, got dtype {arr.dtype}")
    value = float(_scalar_item(arr, name))
    if not math.isfinite(value):
        raise RequestError(name, f"must be finite, got {value}")
    return value
