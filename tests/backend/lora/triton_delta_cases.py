"""The LoRA delta's Triton kernels (backend/lora/triton_delta.py) under the interpreter, against the token-by-token
reference. Run by ``test_triton_delta.py`` in a fresh process with ``TRITON_INTERPRET=1``."""
import os

if os.environ.get("TRITON_INTERPRET") != "1":
    raise RuntimeError("run with TRITON_INTERPRET=1 (see test_triton_delta.py)")

import pytest
import torch

from backend.lora.delta import lora_delta_reference
from backend.lora.triton_delta import triton_delta_matches, triton_lora_delta


@pytest.mark.parametrize("slots", [[-1, 0, 0, 2, -1, 1], [1], [-1, -1]])
@pytest.mark.parametrize("k,n,r", [(40, 24, 12), (130, 70, 48)])
def test_matches_reference_fp32(slots, k, n, r):
    g = torch.Generator().manual_seed(k + len(slots))
    x, a, b = torch.randn(len(slots), k, generator=g), torch.randn(3, r, k, generator=g), torch.randn(3, n, r, generator=g)
    y = torch.randn(len(slots), n, generator=g)
    s = torch.tensor(slots, dtype=torch.int32)
    expected = y.double() + lora_delta_reference(x, a, b, s)
    triton_lora_delta(x, y, a, b, s)
    torch.testing.assert_close(y.double(), expected, rtol=1e-4, atol=1e-3)


def test_the_device_check_passes_in_fp16():
    assert triton_delta_matches(torch.device("cpu"), torch.float16)
