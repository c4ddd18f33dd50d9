"""Preprocess: tokenizer, chat template, and validation of one Triton request (pure Python)."""
from contracts.output_options import OPTIONS_VERSION, OutputOptions
from preprocess.chat_template import ChatTemplate, ChatTemplateError, render_chat
from preprocess.errors import RequestError
from preprocess.request import (
    GUIDE_TYPES,
    KNOWN_INPUTS,
    PreprocessedRequest,
    RequestLimits,
    RequestParser,
    output_options_json,
)
from preprocess.tokenizer import Tokenizer, TokenizerConfig, TokenizerError, load_tokenizer, read_tokenizer_config

__all__ = [
    "ChatTemplate", "ChatTemplateError", "render_chat", "RequestError", "OPTIONS_VERSION", "OutputOptions",
    "GUIDE_TYPES", "KNOWN_INPUTS", "PreprocessedRequest", "RequestLimits", "RequestParser", "output_options_json",
    "Tokenizer", "TokenizerConfig", "TokenizerError", "load_tokenizer", "read_tokenizer_config",
]
