"""Build and load the native ops once per process (see the package docstring).

    python -m backend.native.build     # build now (``make install`` does): later starts load the cache

A build compiles every ``csrc/*.cpp`` (about 2 minutes on 2 cores); the library is cached under a
key of the sources, their paths, the flags, torch's version and the CPU's, so a second run with the
same sources only loads it. A build at first use logs what it is doing before it starts, as the load is otherwise
silent for that long.
"""
from __future__ import annotations

import functools
import hashlib
import logging
import os
import platform
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CSRC = Path(__file__).resolve().parent / "csrc"
REPO = Path(__file__).resolve().parents[2]
LIBRARY = "triton_llm"
CFLAGS = ("-O3", "-march=native", "-fopenmp", "-ffast-math", "-fno-finite-math-only")
LDFLAGS = ("-fopenmp",)
BUILD_ESTIMATE = "about 2 minutes on 2 cores, less with more"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NativeBuild:
    ops: Any | None          # torch.ops.triton_llm once built, else None
    reason: str = ""         # why ``ops`` is None
    failed: bool = False     # a compiler was there and the build or load failed

    @property
    def available(self) -> bool:
        return self.ops is not None


def cache_dir() -> Path:
    """``$TRITON_LLM_CACHE_DIR/native`` if set, else the repository's ``.cache/native``."""
    root = os.environ.get("TRITON_LLM_CACHE_DIR")
    return (Path(root) if root else REPO / ".cache") / "native"


def build_key(sources: list[Path]) -> str:
    """Artefacts depend on the sources and headers, torch's version, the flags and this CPU's
    instruction set (-march=native): a changed header gets a fresh build directory, since the JIT
    builder only watches the ``.cpp`` files it compiles. The sources' paths count too: ninja
    recompiles when the commands name other files, so two checkouts sharing a cache get a directory
    each instead of rebuilding each other's."""
    import torch
    h = hashlib.sha256(torch.__version__.encode())
    h.update(platform.machine().encode())
    h.update(_cpu_flags().encode())
    h.update(" ".join(CFLAGS + LDFLAGS).encode())
    for src in sources:
        h.update(str(src).encode())
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


def is_built(build_dir: Path) -> bool:
    """A finished build is in ``build_dir``: loading it compiles nothing (its key covers every input)."""
    return (build_dir / f"{LIBRARY}_native.so").is_file()


@functools.cache
def native_ops() -> NativeBuild:
    """Compile (first call in a fresh cache: see ``BUILD_ESTIMATE``) and load the ops, or say why not."""
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
    if not is_built(build_dir):
        log.warning("compiling the native CPU kernels (%d C++ files) into %s: %s, once per source change "
                    "(`python -m backend.native.build` or `make install` does it ahead of a start)",
                    len(sources), build_dir, BUILD_ESTIMATE)
    try:
        load(name=f"{LIBRARY}_native", sources=[str(s) for s in sources], build_directory=str(build_dir),
             extra_cflags=list(CFLAGS), extra_ldflags=list(LDFLAGS), is_python_module=False, verbose=False)
    except Exception as exc:  # a compiler or linker failure: the torch path serves instead
        return NativeBuild(None, f"native build failed: {str(exc).strip().splitlines()[-1][:300]}", failed=True)
    return NativeBuild(getattr(torch.ops, LIBRARY))


def main() -> int:
    """Build the ops unless the cache holds them; 1 when a compiler is there and the build fails."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    t0 = time.monotonic()
    build = native_ops()
    if build.available:
        print(f"native kernels ready in {time.monotonic() - t0:.1f} s ({cache_dir()})")
        return 0
    print(f"native kernels unavailable: {build.reason} (the torch path serves instead)", file=sys.stderr)
    return 1 if build.failed else 0


if __name__ == "__main__":
    sys.exit(main())
