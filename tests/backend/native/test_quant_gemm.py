"""The quantized GEMM (backend/native/csrc/quant_gemm*.cpp: int8 / int4 weights x block-wise int8 activations) against
the float64 reference of the same maths (backend/model/quant_strips.py), and its batch invariance bit for bit."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from backend.native.build import CSRC

from backend.model.quant_pack import pack_int4, quantize_int4, quantize_int8, unpack_int4
from backend.model.quant_strips import (
    QuantStrips,
    quant_gemm_reference,
    quantize_blocks_reference,
    strips_int4,
    strips_int8,
)

# (tokens, out rows, in columns): rows not a multiple of a strip (16) nor of a tile's 4 strips, fewer than one strip,
# more tokens than a register tile (4), prefill-sized steps; inner widths of one span of 8 blocks or less, whole
# spans, and a partial last span.
SHAPES = [(1, 1280, 256), (2, 37, 64), (3, 9, 96), (4, 100, 32), (5, 1027, 128), (7, 13, 192), (9, 515, 160),
          (33, 70, 256), (64, 200, 512), (6, 50, 320), (2, 130, 704)]


@pytest.fixture(scope="module")
def ops(native_lib):
    if not hasattr(native_lib, "quant_gemm"):
        pytest.skip("the native library has no quant_gemm op")
    return native_lib


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def threads(request):
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


def weights(mode: str, n: int, k: int, group: int, gen: torch.Generator, asymmetric: bool = False):
    """(strips, integer weight [n, K] float64, scale [n, G], zeros [n, G]) of a random weight."""
    w = torch.randn(n, k, generator=gen)
    if mode == "int8":
        q, scale = quantize_int8(w)
        return strips_int8(q, scale[:, None]), q.double(), scale[:, None], torch.zeros(n, 1)
    packed, scale = quantize_int4(w, group)
    zeros = None
    if asymmetric:
        nib = torch.randint(0, 16, (n, k), generator=gen)
        packed, zeros = pack_int4(nib), torch.randint(4, 12, scale.shape, generator=gen).float()
    z = torch.full_like(scale, 8.0) if zeros is None else zeros
    return strips_int4(packed, scale, zeros), unpack_int4(packed).double(), scale, z


def run(ops, x: torch.Tensor, s: QuantStrips, bias: torch.Tensor | None = None) -> torch.Tensor:
    return ops.quant_gemm(x, s.strips, s.scales, s.aux, s.n, bias)


def test_activation_quantization_matches_reference(ops):
    x = torch.randn(5, 256) * torch.rand(5, 256) * 4
    x[1, :32] = 0.0                                     # an all-zero block: scale 0, codes 0
    xq, sx, xsum = ops.quant_quantize_blocks(x)
    ref_q, ref_s = quantize_blocks_reference(x)
    assert torch.equal(sx, ref_s)
    assert (xq.double() - ref_q).abs().max().item() <= 1           # a product at a rounding tie may go either way
    assert (xq.double() != ref_q).float().mean().item() < 1e-3
    assert torch.equal(xsum, xq.view(5, 8, 32).sum(dim=2, dtype=torch.int32))
    assert int(xq.abs().max()) == 127 and not xq[1, :32].any()


@pytest.mark.parametrize("mode,group,asym", [("int8", 0, False), ("int4", 32, False), ("int4", 64, True),
                                             ("int4", 128, False)])
def test_matches_float64_reference_of_the_same_maths(ops, threads, mode, group, asym):
    gen = torch.Generator().manual_seed(3)
    for i, (tokens, n, k) in enumerate(SHAPES):
        if mode == "int4" and k % group:
            continue
        s, w, scale, zeros = weights(mode, n, k, group, gen, asym)
        x, bias = torch.randn(tokens, k, generator=gen), torch.randn(n, generator=gen)
        xq, sx, _ = ops.quant_quantize_blocks(x)
        for b in (None, bias):
            exact = quant_gemm_reference(xq.double(), sx, w, scale, zeros, b)
            # fp32 rounding of each block's float steps: a few ulps of the sum of the blocks' magnitudes
            mag = quant_gemm_reference(xq.double().abs(), sx, w.abs(), scale.abs(), -zeros.abs(), None).abs()
            y = run(ops, x, s, b)
            assert y.shape == (tokens, n)
            err = (y.double() - exact).abs()
            assert (err <= 1e-6 * mag + 1e-6).all(), (i, err.max().item())


@pytest.mark.parametrize("mode,group", [("int8", 0), ("int4", 64)])
def test_each_token_and_row_is_independent_of_the_rest(ops, mode, group):
    """Bit for bit: a token's output does not depend on the other tokens of the step (9: three register tiles, a
    partial one), on the split over threads, nor on where its row falls in a strip or a tile of strips (10 blocks:
    a whole span and a partial one)."""
    gen = torch.Generator().manual_seed(11)
    n, k = 1283, 320
    w = torch.randn(n, k, generator=gen)
    x, bias = torch.randn(9, k, generator=gen), torch.randn(n, generator=gen)

    def pack(rows: slice) -> QuantStrips:
        if mode == "int8":
            q, scale = quantize_int8(w[rows])
            return strips_int8(q, scale[:, None])
        packed, scale = quantize_int4(w[rows], group)
        return strips_int4(packed, scale)

    s = pack(slice(None))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        together = run(ops, x, s, bias)
        torch.set_num_threads(1)
        alone = torch.cat([run(ops, x[t:t + 1], s, bias) for t in range(9)])
        pairs = torch.cat([run(ops, x[t:t + 2], s, bias) for t in range(0, 9, 2)])[:9]
        rows = torch.cat([run(ops, x, pack(slice(r, r + 5)), bias[r:r + 5]) for r in range(0, n, 5)], dim=1)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(together, alone) and torch.equal(together, pairs) and torch.equal(together, rows)


def test_refuses_bad_inputs(ops):
    q, scale = quantize_int8(torch.randn(20, 64))
    s = strips_int8(q, scale[:, None])
    with pytest.raises(RuntimeError, match="quant_gemm: x"):
        ops.quant_gemm(torch.randn(2, 64).double(), s.strips, s.scales, s.aux, 20)
    with pytest.raises(RuntimeError, match="multiple of 32"):
        ops.quant_gemm(torch.randn(2, 48), s.strips, s.scales, s.aux, 20)
    with pytest.raises(RuntimeError, match="strips"):
        ops.quant_gemm(torch.randn(2, 96), s.strips, s.scales, s.aux, 20)      # another K
    with pytest.raises(RuntimeError, match="strips"):
        ops.quant_gemm(torch.randn(2, 64), s.strips, s.scales, s.aux, 40)      # another n: more strips
    with pytest.raises(RuntimeError, match="wsum"):
        ops.quant_gemm(torch.randn(2, 64), s.strips, s.scales, s.aux.float(), 20)
    with pytest.raises(RuntimeError, match="bias"):
        ops.quant_gemm(torch.randn(2, 64), s.strips, s.scales, s.aux, 20, torch.randn(3))


def cpu_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


ISAS = [("avx512_vnni", ["-mavx512f", "-mavx512bw", "-mavx512vnni", "-mfma"], {"avx512f", "avx512bw", "avx512_vnni"}),
        ("avx2", ["-mavx2", "-mfma"], {"avx2", "fma"}), ("generic", [], set())]


@pytest.mark.parametrize("isa,flags,needs", ISAS, ids=["avx512_vnni", "avx2", "x86-64"])
def test_each_instruction_set_gives_the_ops_bits(ops, tmp_path, isa, flags, needs):
    """The kernel built alone for each instruction set (AVX-512 VNNI, AVX2 with its exact int16 pair sums, plain C++)
    computes the op's results bit for bit: integer dots, then the same float steps per output."""
    if shutil.which("g++") is None:
        pytest.skip("no g++ on PATH")
    if not needs <= cpu_flags():
        pytest.skip(f"this CPU lacks {sorted(needs - cpu_flags())}")
    exe = tmp_path / "quant_gemm_driver"
    subprocess.run(["g++", "-O3", "-std=c++17", "-ffast-math", "-fno-finite-math-only", *flags, f"-I{CSRC}",
                    str(Path(__file__).with_name("quant_gemm_driver.cpp")), str(CSRC / "quant_gemm_kernel.cpp"),
                    "-o", str(exe)], check=True, capture_output=True, timeout=300)
    gen = torch.Generator().manual_seed(5)
    for mode, group, asym in (("int8", 0, False), ("int4", 64, True), ("int4", 32, False)):
        for tokens, n, k in ((1, 100, 128), (6, 37, 192), (9, 70, 384)):
            s, _, _, _ = weights(mode, n, k, group or k, gen, asym)
            x, bias = torch.randn(tokens, k, generator=gen), torch.randn(n, generator=gen)
            x.numpy().tofile(tmp_path / "x.f32")
            bias.numpy().tofile(tmp_path / "bias.f32")
            s.scales.numpy().tofile(tmp_path / "scales.f32")
            s.strips.numpy().tofile(tmp_path / "strips.bin")
            s.aux.numpy().tofile(tmp_path / "aux.bin")
            args = [mode, tokens, n, k, s.scales.shape[1], s.strips.shape[0] // 2, tmp_path]
            out = subprocess.run([str(exe), *map(str, args)], check=True, capture_output=True, text=True, timeout=60)
            assert out.stdout.strip() == isa
            y = torch.from_numpy(np.fromfile(tmp_path / "y.f32", dtype="float32")).view(tokens, n)
            assert torch.equal(y, run(ops, x, s, bias)), (mode, tokens, n, k)
