"""Fixtures shared by the backend tests."""
from __future__ import annotations

import pytest

from backend.native import native_ops


@pytest.fixture(scope="session")
def native_lib():
    """``torch.ops.triton_llm`` (the native library), or a skip with the build's reason (no C++ compiler)."""
    build = native_ops()
    if not build.available:
        pytest.skip(f"native ops unavailable: {build.reason}")
    return build.ops
