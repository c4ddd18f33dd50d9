"""What the training scripts share: the repeated-span check, the positive-flag check, seeding."""
from __future__ import annotations

import pytest
import torch

from tools.training import check_positive, copy_span, seeded


def test_copy_span_is_checked_with_the_fraction():
    assert copy_span(0.5, "8,128") == (8, 128)
    for fraction, span in ((1.5, "8,128"), (0.5, "1,8"), (0.5, "9,8"), (0.5, "8")):
        with pytest.raises(ValueError, match="^--copy-fraction must be in"):
            copy_span(fraction, span)


def test_check_positive_names_the_first_bad_flag_and_skips_what_was_not_given():
    check_positive(steps=None, seq_len=256)
    with pytest.raises(ValueError, match="^--seq-len must be positive$"):
        check_positive(steps=None, seq_len=0, batch=-1)


def test_seeded_runs_draw_the_same():
    a = seeded(3, torch.get_num_threads()).integers(0, 1000, 5), torch.rand(3)
    b = seeded(3, torch.get_num_threads()).integers(0, 1000, 5), torch.rand(3)
    assert list(a[0]) == list(b[0]) and torch.equal(a[1], b[1])
