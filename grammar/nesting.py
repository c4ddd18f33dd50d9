"""How deeply a guide's text nests, measured before any recursive parser reads it.

Python's ``json``, ``re`` and the schema walk recurse once per level and raise ``RecursionError`` a few
hundred levels down; xgrammar's parsers recurse in C++. So a guide nested past ``max_depth`` is refused
by counting its brackets, which costs one pass and no recursion:

- ``json_depth``: ``[`` and ``{`` outside JSON strings (a JSON schema);
- ``group_depth``: ``(`` outside escapes and character classes (a regex), and outside quoted strings
  when ``quotes`` is set (an EBNF grammar, whose strings are ``"..."`` and ``'...'``).
"""
from __future__ import annotations

DEFAULT_MAX_DEPTH = 64    # preprocess's max_guide_depth by default
# The most any setting may allow: jsonschema's check of a schema recurses about 7 frames per level, and
# Python stops at 1,000 frames (a JSON schema 127 levels deep fails there); regexes and grammars go deeper.
MAX_PARSE_DEPTH = 100


def json_depth(text: str) -> int:
    """The deepest nesting of arrays and objects in JSON ``text`` (well formed or not)."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth = max(depth - 1, 0)
    return deepest


def group_depth(text: str, quotes: str = "") -> int:
    """The deepest nesting of ``(...)`` groups in a pattern or grammar ``text``."""
    depth = deepest = 0
    in_class = escaped = False
    quote = ""
    for ch in text:
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif quote:
            if ch == quote:
                quote = ""
        elif in_class:
            if ch == "]":
                in_class = False
        elif ch in quotes:
            quote = ch
        elif ch == "[":
            in_class = True
        elif ch == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif ch == ")":
            depth = max(depth - 1, 0)
    return deepest
