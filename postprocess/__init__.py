"""Postprocess: incremental detokenization, text-level stop strings, finish reasons (pure Python).

Nothing is imported eagerly: importing one module (``postprocess.detokenizer``, say) does not pull in
the Triton glue. The names below load on first use.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "IncrementalDetokenizer": "detokenizer", "TextDecoder": "detokenizer",
    "FINISH_REASONS": "processor", "Postprocessor": "processor", "ProcessedOutput": "processor",
    "normalize_finish_reason": "processor",
    "RequestState": "state", "RequestStateTable": "state", "SequenceState": "state", "TableStats": "state",
    "StopMatcher": "stop_matcher", "StopResult": "stop_matcher", "stop_text_reference": "stop_matcher",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'postprocess' has no attribute {name!r}")
    return getattr(importlib.import_module(f"postprocess.{module}"), name)
