"""A pytest plugin that turns the fast decode step on in every engine a test builds.

    .venv/bin/python -m pytest -p tests.helpers.force_fast_decode tests/backend/engine/test_engine_oracle.py ...

runs the oracle suites (or any engine test) once with ``fast_decode=True`` whatever their configs say;
models the native step cannot serve (sliding windows, quantized weights) keep the eager path, as in serving.
"""
from __future__ import annotations

import dataclasses

import pytest


@pytest.fixture(autouse=True)
def _force_fast_decode(monkeypatch):
    from backend.engine import builder

    build = builder.build_fast_decode

    def forced(config, *args, **kwargs):
        return build(dataclasses.replace(config, fast_decode=True), *args, **kwargs)

    monkeypatch.setattr(builder, "build_fast_decode", forced)
