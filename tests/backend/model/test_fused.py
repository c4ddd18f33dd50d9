"""Fused elementwise ops (backend/model/fused.py, fused_kernels.py): the kernels run interpreted in a fresh
process (TRITON_INTERPRET must precede triton); here, when they run and how a failing or disagreeing kernel is
refused."""
from pathlib import Path

import torch

from backend.model.fused import TORCH_OPS, FusedOps, check_against_reference, fused_ops
from tests.helpers.isolated import assert_interpreted_cases_pass

HERE = Path(__file__).resolve().parent


def test_fused_kernels_under_interpreter():
    assert_interpreted_cases_pass(HERE / "fused_cases.py", timeout=600)


def test_off_on_the_cpu_and_when_asked(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert fused_ops(torch.device("cpu"), torch.float32, 64) == (None, "CUDA only")
    monkeypatch.setenv("TRITON_LLM_FUSED", "0")
    assert fused_ops(torch.device("cuda"), torch.bfloat16, 64) == (None, "off (TRITON_LLM_FUSED=0)")


def test_the_torch_ops_pass_their_own_check():
    assert check_against_reference(TORCH_OPS, torch.device("cpu"), torch.float32, 64) == ""


def test_a_kernel_that_fails_or_disagrees_is_refused_with_the_reason():
    def broken(*args):
        raise RuntimeError("no kernel image is available for execution on the device")

    failing = FusedOps(TORCH_OPS.add_rms_norm, broken, TORCH_OPS.rope)
    assert check_against_reference(failing, torch.device("cpu"), torch.float32, 64) == \
        "silu_mul failed (RuntimeError: no kernel image is available for execution on the device)"

    def off_by_a_bit(x, cos, sin):
        return TORCH_OPS.rope(x, cos, sin) * 1.01

    wrong = FusedOps(TORCH_OPS.add_rms_norm, TORCH_OPS.silu_mul, off_by_a_bit)
    assert check_against_reference(wrong, torch.device("cpu"), torch.float32, 64).startswith("rope disagrees")
