"""A pytest plugin that turns the fast decode step on in every engine a test builds.

    .venv/bin/python -m pytest -p tests.helpers.force_fast_decode tests/backend/engine/test_engine_oracle.py ...

runs the oracle suites (or any engine test) once with ``fast_decode=True`` whatever their configs say (the
target's decode steps and a draft model's steps alike); models the native step cannot serve (sliding
windows, quantized weights) keep the eager path, as in serving.
"""
from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _force_fast_decode(monkeypatch):
    from backend.engine import builder

    for name in ("build_fast_decode", "build_speculator"):
        monkeypatch.setattr(builder, name, forced(getattr(builder, name)))


def forced(build):
    def with_fast_decode(config, *args, **kwargs):
        return build(config.with_settings(fast_decode=True), *args, **kwargs)
    return with_fast_decode
