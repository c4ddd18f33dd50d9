"""The keyed draws' native ops (backend/native/csrc/keyed_draw.cpp) against their torch references, bit for bit:
``position_uniforms`` / ``token_uniforms`` (backend/sampling/keyed_noise.py), ``cdf_draw`` / ``race_draw``
(backend/sampling/ops.py), and ``DrawKernels`` giving the same tokens with either."""
from __future__ import annotations

import pytest
import torch

from backend.sampling.keyed_draw import TORCH_DRAWS, DrawKernels, DrawKeys, DrawRule
from backend.sampling.keyed_noise import NoiseStream, position_uniforms, token_uniforms
from backend.sampling.ops import cdf_draw, race_draw

STREAMS = [*NoiseStream, 2**32 - 1]
SEED_EDGES = [0, 1, 2**32 - 1, 2**32, 2**63, 2**64 - 1]


@pytest.fixture(scope="module")
def ops(native_lib):
    return native_lib


def random_keys(n: int, seed: int) -> torch.Tensor:   # -> [n, 4] int64 (DrawKeys.packed's layout)
    """Seeds over all of [0, 2**64) (the edges first), sequence indices and positions up to 2**31."""
    gen = torch.Generator().manual_seed(seed)
    words = torch.randint(0, 2**32, (n, 2), generator=gen, dtype=torch.int64)
    seeds = [int(lo) | int(hi) << 32 for lo, hi in words.tolist()]
    seeds[:len(SEED_EDGES)] = SEED_EDGES[:n]
    seq = torch.randint(0, 8, (n,), generator=gen).tolist()
    pos = torch.randint(0, 2**31 + 1, (n,), generator=gen).tolist()
    pos[:3] = [0, 2**31, 1][:n]
    return DrawKeys(seeds, seq, pos).packed()


def reference_uniforms(keys: torch.Tensor, stream: int) -> torch.Tensor:   # [n, 4] -> [n] float64
    return position_uniforms(keys[:, :2], keys[:, 2], keys[:, 3], stream)


def rows_of_every_kind(n: int, vocab: int, seed: int) -> torch.Tensor:   # -> [n, vocab] float32 >= 0
    """Softmax rows at several temperatures, rows with half or 90% zeros, one-hot rows (the hot token first, last, anywhere),
    top-k-like rows (1 to 64 tokens), unnormalised rows (scaled by 1e-30 to 1e30), denormal entries, all-zero rows."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, vocab, generator=gen) * torch.tensor([0.3, 1.0, 3.0, 10.0]).repeat(n)[:n, None]
    probs = torch.softmax(logits, dim=-1)
    for r in range(n):
        kind = r % 9
        if kind == 1:
            probs[r, torch.rand(vocab, generator=gen) < (0.5, 0.9)[r % 2]] = 0.0
        elif kind == 2:
            hot = [0, vocab - 1, int(torch.randint(vocab, (1,), generator=gen))][r % 3]
            probs[r] = 0.0
            probs[r, hot] = 1.0
        elif kind == 3:
            k = int(torch.randint(1, min(64, vocab) + 1, (1,), generator=gen))
            keep = torch.topk(probs[r], k).indices
            sparse = torch.zeros(vocab)
            sparse[keep] = probs[r, keep]
            probs[r] = sparse
        elif kind == 4:
            probs[r] *= float(10.0 ** int(torch.randint(-30, 31, (1,), generator=gen)))
        elif kind == 5:
            probs[r, torch.rand(vocab, generator=gen) < 0.3] = 1e-42     # denormal float32
        elif kind == 6 and r % 27 == 6:
            probs[r] = 0.0
    return probs


@pytest.mark.parametrize("stream", STREAMS)
def test_uniforms_equal_position_uniforms(ops, stream):
    keys = random_keys(4000, seed=stream % 97)
    got = ops.keyed_uniforms(keys, int(stream))
    assert got.dtype == torch.float64 and torch.equal(got, reference_uniforms(keys, stream))


@pytest.mark.parametrize("vocab", [1, 2, 31, 32, 33, 64, 1001, 4096])
def test_token_uniforms_equal_token_uniforms(ops, vocab):
    keys = random_keys(20, seed=vocab)
    for stream in (NoiseStream.TOKEN, NoiseStream.DRAFT):
        expected = token_uniforms(keys[:, :2], keys[:, 2], keys[:, 3], vocab, stream)
        assert torch.equal(ops.keyed_token_uniforms(keys, vocab, int(stream)), expected)


@pytest.mark.parametrize("vocab", [1, 2, 7, 33, 1000, 4096])
def test_cdf_draw_equals_the_torch_draw_on_every_row(ops, vocab):
    n = max(64, min(20_000, 2_000_000 // (vocab * 4)))   # small vocabularies: 20,000 keys, not millions
    probs, keys = rows_of_every_kind(n, vocab, seed=vocab), random_keys(n, seed=vocab + 1)
    for stream in (NoiseStream.DRAW, NoiseStream.RESIDUAL):
        expected = cdf_draw(probs, reference_uniforms(keys, stream)[:, None])
        assert torch.equal(ops.keyed_cdf_draw(probs, keys, int(stream)), expected)


def test_cdf_draw_sums_in_id_order(ops):
    """Rows where the order of the running sum decides the token: 1, then 2**14 tokens of 2**-53 (each lost when
    added to 1 in id order, not when added together first), then b with u * (1 + b) in (1, 1 + 2**-39): the
    sequential sum (torch's) draws the last token, a sum that adds the small tokens together first one of them."""
    small = 2**14
    positions = torch.arange(2**17)
    keys = torch.stack([torch.full_like(positions, 7), torch.zeros_like(positions), torch.zeros_like(positions),
                        positions], dim=1)
    u = reference_uniforms(keys, NoiseStream.DRAW)
    rows = (u > 1 - 2**-17).nonzero().flatten()[:3]
    assert len(rows)
    for r in rows.tolist():
        b = torch.tensor((1 + small * 2.0**-54) / u[r].item() - 1, dtype=torch.float32)
        probs = torch.cat([torch.ones(1), torch.full((small,), 2.0**-53), b[None]])[None]
        expected = cdf_draw(probs, u[r:r + 1, None])
        tiny_first = torch.cat([torch.ones(1, dtype=torch.float64),
                                1 + torch.full((small,), 2.0**-53, dtype=torch.float64).cumsum(0),
                                1 + small * 2.0**-53 + b[None].double()])
        other = torch.searchsorted(tiny_first, u[r] * (1 + b.double()), right=True)   # the same target
        assert expected.item() == small + 1 and 0 < other.item() <= small      # the order decides
        assert torch.equal(ops.keyed_cdf_draw(probs, keys[r:r + 1], int(NoiseStream.DRAW)), expected)


@pytest.mark.parametrize("vocab", [1, 2, 7, 33, 1000, 4096])
def test_race_draw_equals_the_torch_race_on_every_row(ops, vocab):
    n = max(64, min(20_000, 1_000_000 // (vocab * 3)))
    probs, keys = rows_of_every_kind(n, vocab, seed=vocab + 2), random_keys(n, seed=vocab + 3)
    expected = race_draw(probs, token_uniforms(keys[:, :2], keys[:, 2], keys[:, 3], vocab, NoiseStream.TOKEN))
    got = ops.keyed_race_draw(probs, keys, int(NoiseStream.TOKEN))
    assert got.dtype == torch.int64 and torch.equal(got, expected), (got != expected).nonzero()[:5].tolist()


def test_draws_take_only_tokens_of_positive_probability(ops):
    probs, keys = rows_of_every_kind(900, 300, seed=5), random_keys(900, seed=6)
    live = probs.sum(-1) > 0
    for op in (ops.keyed_cdf_draw, ops.keyed_race_draw):
        tokens = op(probs, keys, 1)
        assert (probs[live].gather(1, tokens[live, None]) > 0).all()
        assert (tokens[~live] == 0).all()                      # torch.argmax of an all-zero row


def test_malformed_rows_match_torch(ops):
    """NaN entries and negative entries (a non-monotone running sum): the same search, the same fallback."""
    gen = torch.Generator().manual_seed(9)
    probs = torch.rand(60, 50, generator=gen)
    probs[::3, 7] = float("nan")
    probs[1::3] -= 0.5
    keys = random_keys(60, seed=10)
    expected = cdf_draw(probs, reference_uniforms(keys, NoiseStream.DRAW)[:, None])
    assert torch.equal(ops.keyed_cdf_draw(probs, keys, int(NoiseStream.DRAW)), expected)
    expected = race_draw(probs, token_uniforms(keys[:, :2], keys[:, 2], keys[:, 3], 50))
    assert torch.equal(ops.keyed_race_draw(probs, keys, int(NoiseStream.TOKEN)), expected)


@pytest.mark.parametrize("threads", [1, 2])
def test_rows_split_over_threads_draw_the_same_tokens(ops, threads):
    """A batch large enough to run on torch's threads (n * vocab above 2**18) gives every row its own draw."""
    probs, keys = rows_of_every_kind(70, 5000, seed=11), random_keys(70, seed=12)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        cdf, race = ops.keyed_cdf_draw(probs, keys, 0), ops.keyed_race_draw(probs, keys, 1)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(cdf, torch.cat([ops.keyed_cdf_draw(probs[i:i + 1], keys[i:i + 1], 0) for i in range(70)]))
    assert torch.equal(race, torch.cat([ops.keyed_race_draw(probs[i:i + 1], keys[i:i + 1], 1) for i in range(70)]))
    assert torch.equal(cdf, cdf_draw(probs, reference_uniforms(keys, 0)[:, None]))


def test_draw_kernels_give_the_reference_tokens(ops):
    kernels = DrawKernels.of(ops)
    assert kernels.native is ops and DrawKernels.of(None) == TORCH_DRAWS and DrawKernels.of(object()) == TORCH_DRAWS
    probs = rows_of_every_kind(40, 257, seed=13)
    keys = DrawKeys([3, 2**64 - 1] * 20, [0, 1] * 20, list(range(40)))
    for rule in DrawRule:
        assert torch.equal(kernels.draw(probs, keys, rule), TORCH_DRAWS.draw(probs, keys, rule))
    assert torch.equal(kernels.draw(probs, keys, DrawRule.INVERSE_CDF, NoiseStream.RESIDUAL),
                       TORCH_DRAWS.draw(probs, keys, DrawRule.INVERSE_CDF, NoiseStream.RESIDUAL))
    assert torch.equal(kernels.uniforms(keys, NoiseStream.ACCEPT), TORCH_DRAWS.uniforms(keys, NoiseStream.ACCEPT))


def test_empty_batches(ops):
    keys = torch.zeros(0, 4, dtype=torch.int64)
    assert ops.keyed_uniforms(keys, 0).shape == (0,)
    assert ops.keyed_cdf_draw(torch.zeros(0, 10), keys, 0).shape == (0,)
    assert ops.keyed_race_draw(torch.zeros(0, 10), keys, 1).shape == (0,)


def test_bad_arguments_are_refused_by_name(ops):
    probs, keys = torch.rand(2, 10), random_keys(2, seed=0)
    bad_key = keys.clone()
    bad_key[1, 3] = 2**32
    negative = keys.clone()
    negative[0, 0] = -1
    for op in (ops.keyed_cdf_draw, ops.keyed_race_draw):
        with pytest.raises(RuntimeError, match="probs must be a contiguous CPU float32"):
            op(probs.double(), keys, 0)
        with pytest.raises(RuntimeError, match="probs must be a contiguous CPU float32"):
            op(torch.rand(10, 2).T, keys, 0)
        with pytest.raises(RuntimeError, match="probs must be a contiguous CPU float32"):
            op(torch.rand(10), keys, 0)
        with pytest.raises(RuntimeError, match="probs has an empty vocabulary"):
            op(torch.rand(2, 0), keys, 0)
        with pytest.raises(RuntimeError, match="probs has 3 rows, keys 2"):
            op(torch.rand(3, 10), keys, 0)
        with pytest.raises(RuntimeError, match=r"keys\[1, 3\] = 4294967296 is not a 32-bit word"):
            op(probs, bad_key, 0)
        with pytest.raises(RuntimeError, match=r"keys\[0, 0\] = -1"):
            op(probs, negative, 0)
        with pytest.raises(RuntimeError, match="keys must be a CPU int64 \\[n, 4\\]"):
            op(probs, keys[:, :3], 0)
        with pytest.raises(RuntimeError, match="keys must be a CPU int64"):
            op(probs, keys.int(), 0)
        with pytest.raises(RuntimeError, match="stream must be in"):
            op(probs, keys, -1)
        with pytest.raises(RuntimeError, match="stream must be in"):
            op(probs, keys, 2**32)
    with pytest.raises(RuntimeError, match="keyed_uniforms: keys must be"):
        ops.keyed_uniforms(keys.double(), 0)
    with pytest.raises(RuntimeError, match="keyed_token_uniforms: vocab must be"):
        ops.keyed_token_uniforms(keys, 0, 1)
