"""Weights moved onto transparent huge pages (backend/engine/huge_pages.py): same values, ties kept, the arena
2 MiB-aligned and advised; nothing moved when the kernel's mode forbids it or the model is small."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from backend.engine import huge_pages
from backend.engine.huge_pages import HUGE_PAGE, huge_page_arena, move_to_huge_pages, thp_mode


def tied_model() -> nn.Module:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Embedding(512, 96), nn.Linear(96, 700), nn.Linear(700, 512, bias=False))
    m.tail = nn.Linear(96, 512, bias=False)
    m.tail.weight = m[0].weight                     # tied to the embedding
    return m


def test_thp_mode_reads_the_bracketed_word(tmp_path):
    f = tmp_path / "enabled"
    f.write_text("always [madvise] never\n")
    assert thp_mode(f) == "madvise"
    assert thp_mode(tmp_path / "missing") == ""


@pytest.mark.skipif(thp_mode() not in ("always", "madvise"), reason="transparent huge pages are off here")
def test_parameters_move_with_their_values_and_ties():
    m = tied_model()
    before = {n: p.detach().clone() for n, p in m.named_parameters(remove_duplicate=False)}
    x = torch.randint(0, 512, (5,))
    expected = m[2](m[1](m[0](x))), m.tail(m[0](x))
    result = move_to_huge_pages(m, min_bytes=0)
    if result.reason == "madvise(MADV_HUGEPAGE) failed":
        # a kernel may refuse the advice whatever its mode reads (seen on a CI machine reading "madvise"):
        # then nothing moves and the model is as it was
        assert result.moved_bytes == 0 and m.tail.weight.data_ptr() == m[0].weight.data_ptr()
        assert all(torch.equal(p, before[n]) for n, p in m.named_parameters(remove_duplicate=False))
        pytest.skip("the kernel refused madvise(MADV_HUGEPAGE) here")
    assert result.moved_bytes >= sum(p.numel() * 4 for p in m.parameters()) and result.reason == ""
    for n, p in m.named_parameters(remove_duplicate=False):
        assert torch.equal(p, before[n]), n
    assert m.tail.weight.data_ptr() == m[0].weight.data_ptr()           # still one tensor
    ptrs = sorted(p.data_ptr() for p in m.parameters())
    assert all(p % 64 == 0 for p in ptrs) and ptrs[0] % HUGE_PAGE == 0   # one arena, aligned
    assert torch.equal(m[2](m[1](m[0](x))), expected[0]) and torch.equal(m.tail(m[0](x)), expected[1])


def test_nothing_moves_when_the_mode_is_never_or_the_model_small(monkeypatch):
    m = tied_model()
    ptrs = [p.data_ptr() for p in m.parameters()]
    assert "too few" in move_to_huge_pages(m).reason                     # ~1 MB < the 32 MiB default
    monkeypatch.setattr(huge_pages, "thp_mode", lambda: "never")
    assert move_to_huge_pages(m, min_bytes=0) == huge_pages.HugePageResult(0, "transparent huge pages are never")
    assert [p.data_ptr() for p in m.parameters()] == ptrs


@pytest.mark.skipif(thp_mode() not in ("always", "madvise"), reason="transparent huge pages are off here")
def test_arena_is_aligned_and_sized():
    a = huge_page_arena(3 * HUGE_PAGE // 4 + 5)
    assert a is not None and a.numel() == 3 * HUGE_PAGE // 4 + 5 and a.data_ptr() % HUGE_PAGE == 0


def test_a_refused_advice_moves_nothing(monkeypatch):
    """A kernel may refuse MADV_HUGEPAGE whatever its mode reads (a sandboxed CI machine did): the model stays
    where it was, ties included, and the result says why."""
    m = tied_model()
    ptrs = [p.data_ptr() for p in m.parameters()]
    monkeypatch.setattr(huge_pages, "thp_mode", lambda: "madvise")
    monkeypatch.setattr(huge_pages, "_madvise_huge", lambda start, length: False)
    assert move_to_huge_pages(m, min_bytes=0) == huge_pages.HugePageResult(0, "madvise(MADV_HUGEPAGE) failed")
    assert [p.data_ptr() for p in m.parameters()] == ptrs and m.tail.weight.data_ptr() == m[0].weight.data_ptr()


@pytest.mark.parametrize("shift", [0, 4096, HUGE_PAGE // 2, HUGE_PAGE - 4096])
def test_the_arena_fits_wherever_the_allocation_lands(monkeypatch, shift):
    """The advised range starts on a 2 MiB boundary and covers every byte of the arena, wherever the allocator
    put the memory (a model under 2 MiB used to find no whole huge page after an unlucky boundary: a skip
    that came and went)."""
    calls = []
    real_empty = torch.empty

    def empty_at(n, dtype):                       # the allocation lands ``shift`` bytes past a boundary
        t = real_empty(n + HUGE_PAGE // 4, dtype=dtype)
        lead = ((-t.data_ptr()) % HUGE_PAGE + shift) % HUGE_PAGE // 4
        return t[lead:lead + n]

    monkeypatch.setattr(huge_pages.torch, "empty", empty_at)
    monkeypatch.setattr(huge_pages, "_madvise_huge", lambda start, length: calls.append((start, length)) or True)
    numel = 475_452                               # ~1.9 MB: less than one huge page
    a = huge_page_arena(numel)
    assert a is not None and a.numel() == numel
    (start, length), = calls
    assert start % HUGE_PAGE == 0 and start == a.data_ptr() and start + length >= a.data_ptr() + numel * 4


def test_copies_go_side_by_side_into_one_arena_or_nowhere(monkeypatch):
    """``copy_to_huge_pages`` (the native step's panels): equal copies in one 2 MiB-aligned arena, in order;
    None when the mode is ``never`` or the advice is refused (the caller keeps its own tensors)."""
    tensors = [torch.randn(3, 5, 64), torch.randn(7), torch.randn(2, 64)]
    monkeypatch.setattr(huge_pages, "thp_mode", lambda: "madvise")
    monkeypatch.setattr(huge_pages, "_madvise_huge", lambda start, length: True)
    copies = huge_pages.copy_to_huge_pages(tensors)
    assert copies is not None and all(torch.equal(c, t) for c, t in zip(copies, tensors))
    assert copies[0].data_ptr() % HUGE_PAGE == 0
    assert [c.data_ptr() - copies[0].data_ptr() for c in copies] == [0, 3 * 5 * 64 * 4, (3 * 5 * 64 + 7) * 4]
    monkeypatch.setattr(huge_pages, "_madvise_huge", lambda start, length: False)
    assert huge_pages.copy_to_huge_pages(tensors) is None
    monkeypatch.setattr(huge_pages, "thp_mode", lambda: "never")
    assert huge_pages.copy_to_huge_pages(tensors) is None


def test_panels_go_to_an_arena_once_they_fill_a_huge_page(monkeypatch):
    """``native_decode.pack_panels``: panels filling less than a huge page stay where packing put them; from one
    huge page on (the demo target's 9.4 MB, under the 32 MiB threshold of the row-major weights) they are copied
    into one 2 MiB-aligned arena, values unchanged."""
    from backend.engine import native_decode

    class Ops:                     # packing as the identity: only where the panels end up is under test
        @staticmethod
        def pack_panels(w):
            return w

    monkeypatch.setattr(huge_pages, "thp_mode", lambda: "madvise")
    monkeypatch.setattr(huge_pages, "_madvise_huge", lambda start, length: True)
    small = [torch.randn(64, 1000), torch.randn(64, 1000)]               # 512 KB
    packed = native_decode.pack_panels(Ops, small)
    assert all(p is w for p, w in zip(packed, small))                    # left where they were
    one_page = HUGE_PAGE // 4
    big = [torch.randn(one_page // 2 + 64), torch.randn(one_page // 2)]    # just over a huge page
    packed = native_decode.pack_panels(Ops, big)
    assert all(p is not w and torch.equal(p, w) for p, w in zip(packed, big))
    assert packed[0].data_ptr() % HUGE_PAGE == 0 and packed[1].data_ptr() == packed[0].data_ptr() + big[0].numel() * 4
