"""Model weights on transparent huge pages, for the CPU decode step that streams all of them every token.

A batch-1 decode step reads every weight once, so it walks hundreds of MB through the TLB: with 4 KiB pages
that is a page walk every 64 cache lines. Linux backs anonymous memory with 2 MiB pages where asked
(``/sys/kernel/mm/transparent_hugepage/enabled`` in ``[madvise]`` mode, the usual default) or everywhere
(``[always]``); torch's allocator asks only under ``THP_MEM_ALLOC_ENABLE=1``, read once at its first
allocation. So ``move_to_huge_pages`` copies a model's float32 parameters into one arena advised with
``MADV_HUGEPAGE`` before its pages are touched, and points the parameters at it (tied weights stay tied).
Nothing happens when the kernel's mode is ``never`` or the system call is unavailable: the result says why.
"""
from __future__ import annotations

import ctypes
import ctypes.util
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

HUGE_PAGE = 2 << 20
MADV_HUGEPAGE = 14
ALIGN_FLOATS = 16            # each tensor starts on a 64-byte cache line
THP_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/enabled")
MIN_HUGE_PAGE_BYTES = 16 * HUGE_PAGE   # below this, weights are moved to no arena: too few pages to matter
# The native step's panels go to an arena once they fill a huge page: the demo target's 9.4 MB of panels (~2,400
# 4 KiB pages, more than the core's L2 TLB holds) run a batch-1 step ~3% faster on 5 huge pages, engine against
# engine in one process (docs/benchmarks.md); the row-major weights stay on MIN_HUGE_PAGE_BYTES.
MIN_PANEL_HUGE_PAGE_BYTES = HUGE_PAGE


@dataclass(frozen=True)
class HugePageResult:
    moved_bytes: int         # bytes of parameters now in the arena (0: none moved)
    reason: str = ""         # why none were moved


def thp_mode(path: Path = THP_ENABLED) -> str:
    """The kernel's transparent-huge-page mode (always, madvise or never), or "" when unknown."""
    try:
        text = path.read_text()
    except OSError:
        return ""
    return text[text.find("[") + 1:text.find("]")] if "[" in text else ""


def _madvise_huge(start: int, length: int) -> bool:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    return libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(length), ctypes.c_int(MADV_HUGEPAGE)) == 0


def huge_page_arena(numel: int) -> torch.Tensor | None:
    """An uninitialised float32 tensor of ``numel`` elements starting on a 2 MiB boundary, advised for huge
    pages before any of its pages is touched; None when the advice fails."""
    length = -(-(numel * 4) // HUGE_PAGE) * HUGE_PAGE       # whole huge pages
    # a huge page more than that, so that a 2 MiB boundary with ``length`` bytes after it lies inside wherever the
    # allocation lands (large: fresh mmap'd memory, no page touched yet)
    raw = torch.empty((length + HUGE_PAGE) // 4, dtype=torch.float32)
    ptr = raw.data_ptr()
    start = -(-ptr // HUGE_PAGE) * HUGE_PAGE
    if not _madvise_huge(start, length):
        return None
    offset = (start - ptr) // 4
    return raw[offset:offset + numel]


def copy_to_huge_pages(tensors: list[torch.Tensor]) -> list[torch.Tensor] | None:
    """Copies of ``tensors`` (any dtypes, each at an offset that is a multiple of its element size) side by side in
    one huge-page arena (the native step's panels and quantized strips); None when the kernel's mode is ``never``
    or the advice fails."""
    if thp_mode() not in ("always", "madvise"):
        return None
    starts, end = [], 0
    for t in tensors:
        start = -(-end // t.element_size()) * t.element_size()
        starts.append(start)
        end = start + t.numel() * t.element_size()
    arena = huge_page_arena(-(-end // 4))
    if arena is None:
        return None
    raw = arena.view(torch.uint8)
    return [raw[at:at + t.numel() * t.element_size()].view(t.dtype).view(t.shape).copy_(t)
            for t, at in zip(tensors, starts)]


def move_to_huge_pages(model: nn.Module, min_bytes: int = MIN_HUGE_PAGE_BYTES) -> HugePageResult:
    """Copy ``model``'s float32 CPU parameters into one huge-page arena (see the module docstring)."""
    mode = thp_mode()
    if mode not in ("always", "madvise"):
        return HugePageResult(0, f"transparent huge pages are {mode or 'unavailable'}")
    params: dict[int, list[nn.Parameter]] = {}
    for p in model.parameters():
        if p.device.type == "cpu" and p.dtype == torch.float32 and p.is_contiguous():
            params.setdefault(p.data_ptr(), []).append(p)
    sizes = {ptr: -(-group[0].numel() // ALIGN_FLOATS) * ALIGN_FLOATS for ptr, group in params.items()}
    total = sum(sizes.values())
    if total * 4 < min_bytes:
        return HugePageResult(0, f"{total * 4} bytes of weights: too few to matter")
    arena = huge_page_arena(total)
    if arena is None:
        return HugePageResult(0, "madvise(MADV_HUGEPAGE) failed")
    at = 0
    with torch.no_grad():
        for ptr, group in params.items():
            first = group[0]
            view = arena[at:at + first.numel()].view(first.shape)
            view.copy_(first)
            for p in group:                                  # tied parameters share one copy
                p.data = view
            at += sizes[ptr]
    return HugePageResult(total * 4)
