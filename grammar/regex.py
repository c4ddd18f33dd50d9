"""Regular expressions as xgrammar reads them (ECMAScript classes), checked with Python's ``re``.

xgrammar's ``\\d``, ``\\w`` and ``\\s`` follow ECMAScript (JSON Schema's regex dialect): ``\\d`` is
``[0-9]``, ``\\w`` is ``[A-Za-z0-9_]``, and ``\\s`` includes U+FEFF, which Python's ``\\s`` does not.
``python_pattern`` rewrites those shorthands (outside character classes, and the positive ones
inside) so that checking an output with ``re`` means what the grammar meant.
"""
from __future__ import annotations

import re

# ECMAScript WhiteSpace and LineTerminator code points (what xgrammar's \s admits)
_ECMA_SPACE = "\\t\\n\\x0b\\x0c\\r \\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000\\ufeff"
_IN_CLASS = {"d": "0-9", "w": "A-Za-z0-9_", "s": _ECMA_SPACE}
_OUTSIDE = {"d": "[0-9]", "D": "[^0-9]", "w": "[A-Za-z0-9_]", "W": "[^A-Za-z0-9_]",
            "s": f"[{_ECMA_SPACE}]", "S": f"[^{_ECMA_SPACE}]"}


def python_pattern(pattern: str) -> str:
    """``pattern`` with ECMAScript's ``\\d \\w \\s`` (and negations outside classes) spelled out for ``re``.

    Negated shorthands inside a class (``[\\D]``) have no ``re`` spelling and are left as they are.
    """
    out: list[str] = []
    in_class = False
    i, n = 0, len(pattern)
    while i < n:
        ch = pattern[i]
        if ch == "\\" and i + 1 < n:
            nxt = pattern[i + 1]
            table = _IN_CLASS if in_class else _OUTSIDE
            out.append(table.get(nxt, ch + nxt))
            i += 2
            continue
        if ch == "[" and not in_class:
            in_class = True
            out.append(ch)
            if pattern.startswith("^", i + 1):     # a leading ^ or ] is part of the class syntax
                out.append("^")
                i += 1
            if pattern.startswith("]", i + 1):
                out.append("]")
                i += 1
        elif ch == "]" and in_class:
            in_class = False
            out.append(ch)
        else:
            out.append(ch)
        i += 1
    return "".join(out)


def compile_python(pattern: str) -> re.Pattern:
    """The ``re`` form of an xgrammar pattern; ``re.error`` when Python cannot read it."""
    return re.compile(python_pattern(pattern))
