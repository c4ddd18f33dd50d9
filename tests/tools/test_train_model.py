"""The copy augmentation of tools/train_model.py: rows that repeat one of their own spans."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tools.train_model import batch_at, batch_with_copies, with_repeated_span


@pytest.mark.parametrize("seed", range(20))
def test_a_repeated_span_is_an_exact_copy_of_an_earlier_span(seed):
    rng = np.random.default_rng(seed)
    window = np.arange(1000, 1257, dtype=np.uint16)          # distinct ids: every span has one source
    row, b, length = with_repeated_span(window, rng, (8, 128))
    assert len(row) == len(window) and 8 <= length <= len(window) // 3
    copy = row[b:b + length]
    a = int(copy[0]) - 1000
    assert a + length <= b                                    # the source ends before the copy starts
    assert np.array_equal(copy, window[a:a + length])
    assert np.array_equal(row[:b], window[:b])                # before the copy: the window unchanged
    assert np.array_equal(row[b + length:], window[b:len(window) - length])   # after it: the window, shifted


def test_fraction_zero_is_the_plain_batch_and_one_repeats_every_row():
    data = np.arange(5000, dtype=np.uint16)
    starts = np.array([0, 700, 1400, 3000])
    plain = batch_at(data, starts, 256)
    rng = np.random.default_rng(0)
    same = batch_with_copies(data, starts, 256, rng, 0.0, (8, 64))
    assert all(torch.equal(p, s) for p, s in zip(plain, same))
    assert rng.random() == np.random.default_rng(0).random()   # nothing drawn: the old runs' data order holds
    x, y = batch_with_copies(data, starts, 256, np.random.default_rng(0), 1.0, (8, 64))
    assert torch.equal(x[:, 1:], y[:, :-1])                   # targets are the inputs shifted by one
    for row in x:                                             # data is increasing: a copy makes a step back
        assert int((row[1:] < row[:-1]).sum()) >= 1
