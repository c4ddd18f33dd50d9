"""Postprocess: incremental detokenization, text-level stop strings, finish reasons (pure Python)."""
from postprocess.detokenizer import IncrementalDetokenizer, TextDecoder
from postprocess.processor import FINISH_REASONS, Postprocessor, ProcessedOutput, normalize_finish_reason
from postprocess.state import RequestState, RequestStateTable, SequenceState, TableStats
from postprocess.stop_matcher import StopMatcher, StopResult, stop_text_reference

__all__ = [
    "IncrementalDetokenizer", "TextDecoder", "FINISH_REASONS", "Postprocessor", "ProcessedOutput",
    "normalize_finish_reason", "RequestState", "RequestStateTable", "SequenceState", "TableStats",
    "StopMatcher", "StopResult", "stop_text_reference",
]
