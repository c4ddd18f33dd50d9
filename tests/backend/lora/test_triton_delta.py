"""The LoRA delta's Triton kernels, interpreted on the CPU in a fresh process (TRITON_INTERPRET must precede triton)."""
from pathlib import Path

from tests.helpers.isolated import assert_interpreted_cases_pass

HERE = Path(__file__).resolve().parent


def test_lora_delta_kernels_under_interpreter():
    assert_interpreted_cases_pass(HERE / "triton_delta_cases.py", timeout=300)
