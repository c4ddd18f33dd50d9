"""The stream-draw baseline: one uniform per row from its sequence's own generator, the inverse-CDF token."""
import torch

from backend.sampling.keyed_draw import DrawKeys, DrawRule
from backend.sampling.ops import cdf_draw
from bench.harness.stream_draws import StreamDraws


def test_each_row_takes_the_next_uniform_of_its_sequence_stream():
    probs = torch.softmax(torch.randn(3, 50, generator=torch.Generator().manual_seed(0)), -1)
    keys = DrawKeys([5, 5, 9], [0, 1, 0], [0, 0, 0])
    draws = StreamDraws()
    got = [draws.draw(probs, keys, DrawRule.INVERSE_CDF).tolist() for _ in range(3)]
    for i, (s, j) in enumerate(zip(keys.seeds, keys.seq_indices)):
        g = torch.Generator().manual_seed(s + j)
        want = [cdf_draw(probs[i:i + 1], torch.rand(1, 1, dtype=torch.float64, generator=g)).item() for _ in range(3)]
        assert [row[i] for row in got] == want
