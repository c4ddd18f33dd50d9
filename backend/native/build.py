"""Build and load the native ops once per process (see the package docstring)."""
from __future__ import annotations

import functools
import hashlib
import os
import platform
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CSRC = Path(__file__).resolve().parent / "csrc"
REPO = Path(__file__).resolve().parents[2]
LIBRARY = "triton_llm"
CFLAGS = ("-O3", "-march=native", "-fopenmp", "-ffast-math", "-fno-finite-math-only")
LDFLAGS = ("-fopenmp",)


@dataclass(frozen=True)
class NativeBuild:
    ops: Any | None          # torch.ops.triton_llm once built, else None
    reason: str = ""         # why ``ops`` is None

    @property
    def available(self) -> bool:
        return self.ops is not None


def cache_dir() -> Path:
    """``$TRITON_LLM_CACHE_DIR/native`` if set, else the repository's ``.cache/native``."""
    root = os.environ.get("TRITON_LLM_CACHE_DIR")
    return (Path(root) if root else REPO / ".cache") / "native"


def build_key(sources: list[Path]) -> str:
    """Artefacts depend on the sources and headers, torch's version and this CPU's instruction set
    (-march=native): a changed header gets a fresh build directory, since the JIT builder only
    watches the ``.cpp`` files it compiles."""
    import torch
    h = hashlib.sha256(torch.__version__.encode())
    h.update(platform.machine().encode())
    h.update(_cpu_flags().encode())
    for src in sources:
        h.update(src.name.encode())
        h.update(src.read_bytes())
    return h.hexdigest()[:16]


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return ""


@functools.cache
def native_ops() -> NativeBuild:
    """Compile (first call in a fresh cache: tens of seconds) and load the ops, or say why not."""
    if os.environ.get("TRITON_LLM_NATIVE", "1") == "0":
        return NativeBuild(None, "disabled by TRITON_LLM_NATIVE=0")
    sources = sorted(CSRC.glob("*.cpp"))
    if not sources:
        return NativeBuild(None, f"no sources in {CSRC}")
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        return NativeBuild(None, "no C++ compiler on PATH")
    import torch
    from torch.utils.cpp_extension import load
    headers = sorted(CSRC.glob("*.h"))
    build_dir = cache_dir() / build_key(sources + headers)
    build_dir.mkdir(parents=True, exist_ok=True)
    try:
        load(name=f"{LIBRARY}_native", sources=[str(s) for s in sources], build_directory=str(build_dir),
             extra_cflags=list(CFLAGS), extra_ldflags=list(LDFLAGS), is_python_module=False, verbose=False)
    except Exception as exc:  # a compiler or linker failure: the torch path serves instead
        return NativeBuild(None, f"native build failed: {str(exc).strip().splitlines()[-1][:300]}")
    return NativeBuild(getattr(torch.ops, LIBRARY))
