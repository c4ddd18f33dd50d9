"""Shared fixtures: the committed demo checkpoints, and tiny random checkpoints for fast tests.

Helpers live in ``tests/helpers/`` and are imported one way: ``from tests.helpers.X import ...``.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.checkpoints import DEMO_TARGET, make_random_checkpoint


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """2-layer random Llama with GQA (4 heads / 2 KV heads), vocab of the demo tokenizer."""
    return make_random_checkpoint(tmp_path_factory.mktemp("tiny") / "ckpt")


@pytest.fixture(scope="session")
def demo_target() -> Path:
    if not (DEMO_TARGET / "model.safetensors").is_file():
        pytest.fail("models/demo-target/model.safetensors is missing: run tools/train_demo.sh")
    return DEMO_TARGET
