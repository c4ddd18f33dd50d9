"""Field checks shared by the validated dataclasses; each raises ``ValueError`` naming the field."""
from __future__ import annotations

import math


def check_int(name: str, value, lo: int | None = None, hi: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}: expected an integer, got {value!r}")
    if lo is not None and value < lo:
        raise ValueError(f"{name}: must be >= {lo}, got {value}")
    if hi is not None and value > hi:
        raise ValueError(f"{name}: must be <= {hi}, got {value}")


def check_float(name: str, value, lo: float | None = None, hi: float | None = None, lo_open: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name}: expected a number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name}: must be finite, got {value}")
    if lo is not None and (value <= lo if lo_open else value < lo):
        raise ValueError(f"{name}: must be {'>' if lo_open else '>='} {lo}, got {value}")
    if hi is not None and value > hi:
        raise ValueError(f"{name}: must be <= {hi}, got {value}")
