"""The Triton weight-only GEMV, interpreted on CPU in a fresh process (TRITON_INTERPRET must precede triton)."""
from pathlib import Path

from tests.helpers.isolated import assert_interpreted_cases_pass

HERE = Path(__file__).resolve().parent


def test_quant_gemv_under_interpreter():
    assert_interpreted_cases_pass(HERE / "quant_triton_cases.py", timeout=300)
