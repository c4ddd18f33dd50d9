from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_ABORT: _ClassVar[FinishReason]

class GuideType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    GUIDE_TYPE_UNSPECIFIED: _ClassVar[GuideType]
    GUIDE_TYPE_JSON_SCHEMA: _ClassVar[GuideType]
    GUIDE_TYPE_ANY_JSON: _ClassVar[GuideType]
    GUIDE_TYPE_REGEX: _ClassVar[GuideType]
    GUIDE_TYPE_EBNF_GRAMMAR: _ClassVar[GuideType]
    GUIDE_TYPE_STRUCTURAL_TAG: _ClassVar[GuideType]

class SpeculativeMethod(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SPECULATIVE_METHOD_UNSPECIFIED: _ClassVar[SpeculativeMethod]
    SPECULATIVE_METHOD_NONE: _ClassVar[SpeculativeMethod]
    SPECULATIVE_METHOD_NGRAM: _ClassVar[SpeculativeMethod]
    SPECULATIVE_METHOD_DRAFT_MODEL: _ClassVar[SpeculativeMethod]
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_ABORT: FinishReason
GUIDE_TYPE_UNSPECIFIED: GuideType
GUIDE_TYPE_JSON_SCHEMA: GuideType
GUIDE_TYPE_ANY_JSON: GuideType
GUIDE_TYPE_REGEX: GuideType
GUIDE_TYPE_EBNF_GRAMMAR: GuideType
GUIDE_TYPE_STRUCTURAL_TAG: GuideType
SPECULATIVE_METHOD_UNSPECIFIED: SpeculativeMethod
SPECULATIVE_METHOD_NONE: SpeculativeMethod
SPECULATIVE_METHOD_NGRAM: SpeculativeMethod
SPECULATIVE_METHOD_DRAFT_MODEL: SpeculativeMethod

class ChatMessage(_message.Message):
    __slots__ = ("role", "content")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ...) -> None: ...

class ChatMessages(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ...) -> None: ...

class GuidedDecoding(_message.Message):
    __slots__ = ("json_schema", "any_json", "regex", "ebnf_grammar", "structural_tag")
    class AnyJson(_message.Message):
        __slots__ = ()
        def __init__(self) -> None: ...
    JSON_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    ANY_JSON_FIELD_NUMBER: _ClassVar[int]
    REGEX_FIELD_NUMBER: _ClassVar[int]
    EBNF_GRAMMAR_FIELD_NUMBER: _ClassVar[int]
    STRUCTURAL_TAG_FIELD_NUMBER: _ClassVar[int]
    json_schema: str
    any_json: GuidedDecoding.AnyJson
    regex: str
    ebnf_grammar: str
    structural_tag: str
    def __init__(self, json_schema: _Optional[str] = ..., any_json: _Optional[_Union[GuidedDecoding.AnyJson, _Mapping]] = ..., regex: _Optional[str] = ..., ebnf_grammar: _Optional[str] = ..., structural_tag: _Optional[str] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("prompt", "messages", "max_tokens", "stream", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty", "seed", "stop_words", "bad_words", "end_id", "pad_id", "min_tokens", "num_return_sequences", "beam_width", "exclude_input_in_output", "return_log_probs", "return_num_input_tokens", "return_num_output_tokens", "skip_special_tokens", "include_stop_str_in_output", "guided_decoding", "request_id", "num_speculative_tokens", "top_logprobs", "lora_name", "ignore_eos", "logit_bias")
    class LogitBiasEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: float
        def __init__(self, key: _Optional[int] = ..., value: _Optional[float] = ...) -> None: ...
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STOP_WORDS_FIELD_NUMBER: _ClassVar[int]
    BAD_WORDS_FIELD_NUMBER: _ClassVar[int]
    END_ID_FIELD_NUMBER: _ClassVar[int]
    PAD_ID_FIELD_NUMBER: _ClassVar[int]
    MIN_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_RETURN_SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    BEAM_WIDTH_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_INPUT_IN_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    RETURN_LOG_PROBS_FIELD_NUMBER: _ClassVar[int]
    RETURN_NUM_INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RETURN_NUM_OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SKIP_SPECIAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_STOP_STR_IN_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    GUIDED_DECODING_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_SPECULATIVE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    LORA_NAME_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    LOGIT_BIAS_FIELD_NUMBER: _ClassVar[int]
    prompt: str
    messages: ChatMessages
    max_tokens: int
    stream: bool
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    repetition_penalty: float
    presence_penalty: float
    frequency_penalty: float
    seed: int
    stop_words: _containers.RepeatedScalarFieldContainer[str]
    bad_words: _containers.RepeatedScalarFieldContainer[str]
    end_id: int
    pad_id: int
    min_tokens: int
    num_return_sequences: int
    beam_width: int
    exclude_input_in_output: bool
    return_log_probs: bool
    return_num_input_tokens: bool
    return_num_output_tokens: bool
    skip_special_tokens: bool
    include_stop_str_in_output: bool
    guided_decoding: GuidedDecoding
    request_id: str
    num_speculative_tokens: int
    top_logprobs: int
    lora_name: str
    ignore_eos: bool
    logit_bias: _containers.ScalarMap[int, float]
    def __init__(self, prompt: _Optional[str] = ..., messages: _Optional[_Union[ChatMessages, _Mapping]] = ..., max_tokens: _Optional[int] = ..., stream: bool = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., min_p: _Optional[float] = ..., repetition_penalty: _Optional[float] = ..., presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., seed: _Optional[int] = ..., stop_words: _Optional[_Iterable[str]] = ..., bad_words: _Optional[_Iterable[str]] = ..., end_id: _Optional[int] = ..., pad_id: _Optional[int] = ..., min_tokens: _Optional[int] = ..., num_return_sequences: _Optional[int] = ..., beam_width: _Optional[int] = ..., exclude_input_in_output: bool = ..., return_log_probs: bool = ..., return_num_input_tokens: bool = ..., return_num_output_tokens: bool = ..., skip_special_tokens: bool = ..., include_stop_str_in_output: bool = ..., guided_decoding: _Optional[_Union[GuidedDecoding, _Mapping]] = ..., request_id: _Optional[str] = ..., num_speculative_tokens: _Optional[int] = ..., top_logprobs: _Optional[int] = ..., lora_name: _Optional[str] = ..., ignore_eos: bool = ..., logit_bias: _Optional[_Mapping[int, float]] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("prompt_tokens", "completion_tokens", "total_tokens", "draft_tokens", "accepted_draft_tokens")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    draft_tokens: int
    accepted_draft_tokens: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., total_tokens: _Optional[int] = ..., draft_tokens: _Optional[int] = ..., accepted_draft_tokens: _Optional[int] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("text", "sequence_index", "token_ids", "log_probs", "cum_log_prob", "finish_reason", "num_output_tokens", "usage", "request_id", "top_log_probs")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_INDEX_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOG_PROBS_FIELD_NUMBER: _ClassVar[int]
    CUM_LOG_PROB_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    NUM_OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOP_LOG_PROBS_FIELD_NUMBER: _ClassVar[int]
    text: str
    sequence_index: int
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    log_probs: _containers.RepeatedScalarFieldContainer[float]
    cum_log_prob: float
    finish_reason: FinishReason
    num_output_tokens: int
    usage: Usage
    request_id: str
    top_log_probs: _containers.RepeatedCompositeFieldContainer[TopLogprobs]
    def __init__(self, text: _Optional[str] = ..., sequence_index: _Optional[int] = ..., token_ids: _Optional[_Iterable[int]] = ..., log_probs: _Optional[_Iterable[float]] = ..., cum_log_prob: _Optional[float] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., num_output_tokens: _Optional[int] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., request_id: _Optional[str] = ..., top_log_probs: _Optional[_Iterable[_Union[TopLogprobs, _Mapping]]] = ...) -> None: ...

class TopLogprobs(_message.Message):
    __slots__ = ("candidates",)
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    candidates: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    def __init__(self, candidates: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ...) -> None: ...

class TokenLogprob(_message.Message):
    __slots__ = ("token_id", "token", "log_prob")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    LOG_PROB_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    token: str
    log_prob: float
    def __init__(self, token_id: _Optional[int] = ..., token: _Optional[str] = ..., log_prob: _Optional[float] = ...) -> None: ...

class TokenizeRequest(_message.Message):
    __slots__ = ("text", "messages", "add_special_tokens")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    ADD_SPECIAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    text: str
    messages: ChatMessages
    add_special_tokens: bool
    def __init__(self, text: _Optional[str] = ..., messages: _Optional[_Union[ChatMessages, _Mapping]] = ..., add_special_tokens: bool = ...) -> None: ...

class TokenizeResponse(_message.Message):
    __slots__ = ("token_ids", "token_count", "prompt", "max_context_tokens")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_COUNT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    MAX_CONTEXT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    token_count: int
    prompt: str
    max_context_tokens: int
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., token_count: _Optional[int] = ..., prompt: _Optional[str] = ..., max_context_tokens: _Optional[int] = ...) -> None: ...

class GetModelInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("name", "triton_model", "max_context_tokens", "vocab_size", "supported_guide_types", "speculative_method", "num_speculative_tokens", "architecture", "quantization", "kv_cache_dtype", "lora_adapters")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TRITON_MODEL_FIELD_NUMBER: _ClassVar[int]
    MAX_CONTEXT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    SUPPORTED_GUIDE_TYPES_FIELD_NUMBER: _ClassVar[int]
    SPECULATIVE_METHOD_FIELD_NUMBER: _ClassVar[int]
    NUM_SPECULATIVE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ARCHITECTURE_FIELD_NUMBER: _ClassVar[int]
    QUANTIZATION_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_DTYPE_FIELD_NUMBER: _ClassVar[int]
    LORA_ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    name: str
    triton_model: str
    max_context_tokens: int
    vocab_size: int
    supported_guide_types: _containers.RepeatedScalarFieldContainer[GuideType]
    speculative_method: SpeculativeMethod
    num_speculative_tokens: int
    architecture: str
    quantization: str
    kv_cache_dtype: str
    lora_adapters: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., triton_model: _Optional[str] = ..., max_context_tokens: _Optional[int] = ..., vocab_size: _Optional[int] = ..., supported_guide_types: _Optional[_Iterable[_Union[GuideType, str]]] = ..., speculative_method: _Optional[_Union[SpeculativeMethod, str]] = ..., num_speculative_tokens: _Optional[int] = ..., architecture: _Optional[str] = ..., quantization: _Optional[str] = ..., kv_cache_dtype: _Optional[str] = ..., lora_adapters: _Optional[_Iterable[str]] = ...) -> None: ...
