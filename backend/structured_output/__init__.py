"""Constrained decoding, the engine's side: the interface it calls and the per-step manager.

The grammar implementation (xgrammar) lives in ``grammar`` and reaches the engine only
through ``backend/engine/builder.py``, which injects it.
"""
