"""The Triton attention kernels: interpreted on CPU (in a fresh process), compiled on CUDA."""
from pathlib import Path

import pytest
import torch

from tests.helpers.isolated import assert_interpreted_cases_pass, run_isolated

HERE = Path(__file__).resolve().parent


def test_kernels_under_interpreter():
    """Every case in triton_interpret_cases.py (GQA 1/4/8, block 16/32, fp32/fp16, split-K)."""
    assert_interpreted_cases_pass(HERE / "triton_interpret_cases.py", timeout=300)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (compiled kernels)")
def test_compiled_kernels_on_gpu():
    res = run_isolated([str(HERE / "gpu_attention_check.py")], {}, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
