"""The f32 GEMV of the decode step (backend/native/csrc/f32_gemv*.cpp, weights packed into panels) against a float64
matmul.

Through the op (the build's instruction set, 1 and 2 threads) and, built alone without torch, for each
instruction set the kernel has (AVX-512, AVX2 + FMA, plain C++) that this CPU can run.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from backend.native.build import CSRC

# (tokens, out rows, in columns): rows not a multiple of a panel (64 or 16) and fewer than one,
# columns not a multiple of a vector (and fewer than one), more tokens than one register tile takes (6).
SHAPES = [(1, 1280, 768), (2, 37, 16), (3, 9, 33), (4, 100, 7), (5, 1027, 64), (6, 13, 200), (7, 8, 48),
          (8, 515, 130), (9, 21, 96), (12, 70, 40), (5, 70, 700), (8, 19, 520), (16, 1300, 768), (11, 700, 200)]


@pytest.fixture(scope="module")
def ops(native_lib):
    return native_lib


def case(tokens: int, n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(tokens, k, generator=gen), torch.randn(n, k, generator=gen), torch.randn(n, generator=gen)


def assert_fp32_close(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> None:
    """As close to the float64 result as at::linear's fp32 result is (a different summation order), or closer."""
    exact = F.linear(x.double(), w.double(), None if bias is None else bias.double())
    linear_err = (F.linear(x, w, bias).double() - exact).abs().max().item()
    err = (y.double() - exact).abs().max().item()
    assert err <= 4 * linear_err + 1e-5 * (1 + exact.abs().max().item()), (err, linear_err)


@pytest.mark.parametrize("threads", [1, 2])
def test_op_matches_matmul(ops, threads):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for i, (tokens, n, k) in enumerate(SHAPES):
            x, w, b = case(tokens, n, k, seed=i)
            panels = ops.pack_panels(w)
            assert_fp32_close(ops.decode_gemv(x, panels, n), x, w, None)
            assert_fp32_close(ops.decode_gemv(x, panels, n, b), x, w, b)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("k", [256, 600])
def test_each_token_and_row_is_independent_of_the_rest(ops, k):
    """Bit for bit: a token's output does not depend on the other tokens of the step (8: two register tiles), nor
    on how the panels are split over threads, nor on where its row falls in a panel (each output is one accumulation
    in a fixed order): batch-invariant greedy decoding."""
    x, w, b = case(8, 1283, k, seed=7)
    panels = ops.pack_panels(w)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        together = ops.decode_gemv(x, panels, 1283, b)
        torch.set_num_threads(1)
        alone = torch.cat([ops.decode_gemv(x[t:t + 1], panels, 1283, b) for t in range(8)])
        rows = torch.cat([ops.decode_gemv(x, ops.pack_panels(w[r:r + 5]), len(w[r:r + 5]), b[r:r + 5])
                          for r in range(0, 1283, 5)], dim=1)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(together, alone) and torch.equal(together, rows)


def test_panels_hold_the_weight_transposed_and_zero_padded(ops):
    w = torch.randn(70, 9)
    panels = ops.pack_panels(w)
    width = ops.gemv_panel_width()
    full, rest = divmod(70, width)
    assert width in (16, 64) and rest and panels.shape == (full + 1, 9, width)
    for p in range(full):
        assert torch.equal(panels[p], w[p * width:(p + 1) * width].t())
    assert torch.equal(panels[full, :, :rest], w[full * width:].t())
    assert not panels[full, :, rest:].any()


def test_op_refuses_bad_inputs(ops):
    panels = ops.pack_panels(torch.randn(4, 8))
    with pytest.raises(RuntimeError, match="decode_gemv: panels"):
        ops.decode_gemv(torch.randn(2, 9), panels, 4)                     # another K
    with pytest.raises(RuntimeError, match="decode_gemv: panels"):
        ops.decode_gemv(torch.randn(2, 8), panels, 70)                    # another N: more panels
    with pytest.raises(RuntimeError, match="decode_gemv: panels"):
        ops.decode_gemv(torch.randn(2, 8), torch.randn(4, 8), 4)          # not packed
    with pytest.raises(RuntimeError, match="decode_gemv: x"):
        ops.decode_gemv(torch.randn(2, 8).double(), panels, 4)
    with pytest.raises(RuntimeError, match="bias"):
        ops.decode_gemv(torch.randn(2, 8), panels, 4, torch.randn(5))
    with pytest.raises(RuntimeError, match="pack_panels"):
        ops.pack_panels(torch.randn(4, 8).double())


def cpu_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


ISAS = [("avx512", ["-mavx512f", "-mavx2", "-mfma"], {"avx512f"}), ("avx2", ["-mavx2", "-mfma"], {"avx2", "fma"}),
        ("generic", [], set())]


@pytest.mark.parametrize("isa,flags,needs", ISAS, ids=[i[0] for i in ISAS])
def test_each_instruction_set_matches_matmul(tmp_path, isa, flags, needs):
    if shutil.which("g++") is None:
        pytest.skip("no g++ on PATH")
    if not needs <= cpu_flags():
        pytest.skip(f"this CPU lacks {sorted(needs - cpu_flags())}")
    exe = tmp_path / "gemv_driver"
    subprocess.run(["g++", "-O2", "-std=c++17", *flags, f"-I{CSRC}", str(Path(__file__).with_name("gemv_driver.cpp")),
                    str(CSRC / "f32_gemv_kernel.cpp"), "-o", str(exe)], check=True, capture_output=True, timeout=300)
    for i, (tokens, n, k) in enumerate(SHAPES):
        x, w, b = case(tokens, n, k, seed=100 + i)
        for name, t in (("x", x), ("w", w), ("bias", b)):
            t.numpy().tofile(tmp_path / f"{name}.f32")
        run = subprocess.run([str(exe), str(tokens), str(n), str(k), str(n // 3), str(tmp_path)], check=True,
                             capture_output=True, text=True, timeout=60)
        assert run.stdout.strip() == isa
        y = torch.from_numpy(np.fromfile(tmp_path / "y.f32", dtype="float32")).view(tokens, n)
        assert_fp32_close(y, x, w, b)
