"""Process setup for code running inside Triton's Python backend stub.

The stub embeds an *isolated* interpreter: environment variables (PYTHONUTF8, PYTHONPATH, ...) are
ignored and the C locale is left as is, so ``open()`` / ``Path.read_text()`` without an explicit
encoding would decode files as ASCII. Each model's ``initialize`` calls ``prepare_stub_process()``
first.
"""
from __future__ import annotations

import locale


def prepare_stub_process() -> str:
    """Switch LC_CTYPE to a UTF-8 locale (text files then default to UTF-8); returns the encoding."""
    if locale.getpreferredencoding(False).lower().replace("-", "") != "utf8":
        for name in ("C.UTF-8", "C.utf8", "en_US.UTF-8", ""):
            try:
                locale.setlocale(locale.LC_CTYPE, name)
            except locale.Error:
                continue
            if locale.getpreferredencoding(False).lower().replace("-", "") == "utf8":
                break
    return locale.getpreferredencoding(False)
