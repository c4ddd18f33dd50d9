"""``CheckpointError``: a checkpoint folder that cannot be loaded (config.py, rope_fields.py, loader.py raise it)."""
from __future__ import annotations


class CheckpointError(ValueError):
    """A checkpoint folder that cannot be loaded; the message names the file and the problem."""
