"""Preprocess: tokenizer, chat template, and validation of one Triton request (pure Python)."""
from .chat_template import ChatTemplate, ChatTemplateError, render_chat
from .errors import RequestError
from .options import OPTIONS_VERSION, OutputOptions
from .request import GUIDE_TYPES, KNOWN_INPUTS, PreprocessedRequest, RequestLimits, RequestParser, output_options_json
from .tokenizer import Tokenizer, TokenizerConfig, TokenizerError, load_tokenizer, read_tokenizer_config

__all__ = [
    "ChatTemplate", "ChatTemplateError", "render_chat", "RequestError", "OPTIONS_VERSION", "OutputOptions",
    "GUIDE_TYPES", "KNOWN_INPUTS", "PreprocessedRequest", "RequestLimits", "RequestParser", "output_options_json",
    "Tokenizer", "TokenizerConfig", "TokenizerError", "load_tokenizer", "read_tokenizer_config",
]
