"""The checks the engine's sub-configs run on their fields: each ``ValueError`` names the field (its
``config.pbtxt`` parameter), so a bad value fails model loading with the parameter to fix."""
from __future__ import annotations

import math

from contracts.validation import check_int

__all__ = ["check_int", "check_str", "check_bool", "check_choice", "check_fraction", "is_number"]


def check_str(name: str, value) -> None:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name}: expected a non-empty string, got {value!r}")


def check_bool(name: str, value) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{name}: expected a boolean, got {value!r}")


def check_choice(name: str, value, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name}: expected one of {choices}, got {value!r}")


def is_number(value) -> bool:
    """A real number (an int or a float, not a bool)."""
    return not isinstance(value, bool) and isinstance(value, (int, float))


def check_fraction(name: str, value, lo_open: bool = False, hi_open: bool = False) -> None:
    if not is_number(value) or not math.isfinite(value):
        raise ValueError(f"{name}: expected a finite number, got {value!r}")
    if (value <= 0 if lo_open else value < 0) or (value >= 1 if hi_open else value > 1):
        raise ValueError(f"{name}: must be in {'(' if lo_open else '['}0, 1{')' if hi_open else ']'}, got {value}")
