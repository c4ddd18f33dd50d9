"""The grammar layer of constrained decoding (xgrammar): a leaf package that preprocess, the engine and postprocess import.

It imports xgrammar, torch and ``contracts`` only (``jsonschema`` lazily, for schema guides), so the
engine loads it without postprocess's detokenizer or Triton glue, and preprocess uses it to check
guides. (xgrammar 0.2.9 itself imports transformers, and with it tokenizers and jinja2.)

- ``prepare_guide`` / ``check_guide``: a guide checked cheaply (``GuideError`` naming the field);
- ``XGrammarBackend``: compile with a cache keyed by guide type, guide text and tokenizer identity;
  ``XGrammarMatcher`` per sequence: accept, validate, rollback, fill bitmask, terminated, jump-forward;
- ``check_output``: a finished output checked against its guide (JSON, jsonschema, regex, EBNF).
"""
from grammar.backend import CompiledGuide, XGrammarBackend, XGrammarMatcher, tokenizer_info_from_folder
from grammar.errors import GUIDE, GUIDE_TYPE, GuideError
from grammar.guides import PreparedGuide, check_guide, prepare_guide
from grammar.output_check import check_output

__all__ = [
    "CompiledGuide", "XGrammarBackend", "XGrammarMatcher", "tokenizer_info_from_folder", "GUIDE", "GUIDE_TYPE",
    "GuideError", "PreparedGuide", "check_guide", "prepare_guide", "check_output",
]
