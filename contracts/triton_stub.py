"""Process setup for code running inside Triton's Python backend stub.

The stub embeds an *isolated* interpreter: environment variables (PYTHONUTF8, PYTHONPATH, ...) are
ignored and the C locale is left as is, so ``open()`` / ``Path.read_text()`` without an explicit
encoding would decode files as ASCII. Each model's ``initialize`` calls ``prepare_stub_process()``
first.

The stub also links the system's ``libpython`` (Debian's 3.11.2 on the demo box) while its standard
library may come from the virtual environment's base interpreter (pyenv's 3.11.7), whose compiled
extensions can need newer C symbols: ``_ssl`` there fails with ``undefined symbol: _PyModule_Add``,
and with it everything that imports ``ssl`` (transformers, which xgrammar imports). When that
happens, the running runtime's own ``lib-dynload`` goes first on ``sys.path``.
"""
from __future__ import annotations

import locale
import sys
from pathlib import Path


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
    use_runtime_extensions()
    return locale.getpreferredencoding(False)


def use_runtime_extensions(candidates: tuple[str, ...] = ("/usr/lib/python{v}/lib-dynload",)) -> str | None:
    """If ``_ssl`` cannot load (extensions built for another patch release than the running
    libpython), put the running runtime's ``lib-dynload`` first; returns the directory used, if any."""
    try:
        import _ssl  # noqa: F401
        return None
    except ImportError:
        pass
    v = f"{sys.version_info.major}.{sys.version_info.minor}"
    for pattern in candidates:
        d = Path(pattern.format(v=v))
        if d.is_dir() and str(d) not in sys.path:
            sys.path.insert(0, str(d))
            try:
                import _ssl  # noqa: F401,F811
                return str(d)
            except ImportError:
                sys.path.remove(str(d))
    return None
