"""The request bodies of the OpenAI-compatible API, as pydantic models (they also write /openapi.json).

Field names and ranges are OpenAI's; the extras vLLM accepts in the body (``top_k``, ``min_p``,
``repetition_penalty``, ``ignore_eos``, ``min_tokens``) and ``num_speculative_tokens`` sit beside
them. Unknown fields are refused (400 naming the field), and so are the known ones that would change
the output and are not implemented (``best_of`` > 1, ``suffix``; see ``refused``): a setting we accept
does what it says. ``logit_bias`` keys must be token ids and its biases in [-100, 100] (``refused`` names
the token). Ranges that depend on the served model (the context, the vocabulary, ``n``'s limit) are left
to the ensemble's preprocess, the one authority, whose errors name the field too.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from contracts.sampling_params import LOGIT_BIAS_BOUND

UINT64_MAX = 2**64 - 1
INT32_MAX = 2**31 - 1    # the ensemble's INT32 inputs
FP32_MAX = 3.4e38        # and its FP32 ones
MAX_STOP = 64            # preprocess's limit on stop strings (RequestLimits.max_stop_words)


def utf8_text(value: Any) -> Any:
    """``value`` unchanged, unless a string in it holds a lone UTF-16 surrogate (JSON's ``"\\ud800"``
    escape decodes to one): no UTF-8 encodes it, so the gRPC request could not carry it."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"not valid Unicode text: a lone surrogate {value[e.start]!r} at character {e.start}") \
                from None
    elif isinstance(value, (list, tuple)):
        for item in value:
            utf8_text(item)
    elif isinstance(value, dict):
        for key, item in value.items():
            utf8_text(key)
            utf8_text(item)
    return value


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    @field_validator("*", mode="before")
    @classmethod
    def _utf8(cls, value: Any) -> Any:
        return utf8_text(value)


class StreamOptions(Body):
    include_usage: bool = False


class TextPart(Body):
    type: Literal["text"]
    text: str


class FunctionCall(Body):
    name: str
    arguments: str


class ToolCall(Body):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(Body):
    """One chat message; ``developer`` is treated as ``system``, ``tool`` carries a tool's result."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content)
        return self.content or ""


class FunctionDef(Body):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(Body):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(Body):
    name: str


class NamedToolChoice(Body):
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(Body):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class ResponseFormat(Body):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class Sampling(Body):
    """What chat and completions share."""

    model: str
    max_tokens: int | None = Field(None, ge=1, le=INT32_MAX)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    n: int = Field(1, ge=1, le=128)
    seed: int | None = Field(None, ge=0, le=UINT64_MAX)
    stop: str | list[str] | None = Field(None, max_length=MAX_STOP)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = Field(None, max_length=256)
    logit_bias: dict[str, float] | None = None
    # vLLM's extras
    top_k: int | None = Field(None, ge=-1, le=INT32_MAX)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(None, gt=0.0, le=FP32_MAX)
    ignore_eos: bool = False
    min_tokens: int | None = Field(None, ge=0, le=INT32_MAX)
    num_speculative_tokens: int | None = Field(None, ge=0, le=64)

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def token_biases(self) -> dict[int, float]:
        """``logit_bias`` with its keys as token ids (``refused`` has checked them)."""
        return {int(k): float(v) for k, v in (self.logit_bias or {}).items()}

    def refused(self) -> tuple[str, str] | None:
        """(param, message) for a setting that would change the output and is not implemented, or out of range."""
        for key, bias in (self.logit_bias or {}).items():
            if not (key.isascii() and key.isdigit()):
                return "logit_bias", f"key {key[:40]!r} is not a token id (a decimal integer)"
            if int(key) > INT32_MAX:
                return "logit_bias", f"token id {key[:40]} is outside the vocabulary"
            if not -LOGIT_BIAS_BOUND <= bias <= LOGIT_BIAS_BOUND:    # (False for NaN)
                return "logit_bias", (f"the bias of token {int(key)} must be in [-{LOGIT_BIAS_BOUND:g}, "
                                      f"{LOGIT_BIAS_BOUND:g}], got {bias:g}")
        if any(s == "" for s in self.stop_list()):
            return "stop", "stop strings must not be empty"
        return None


class ChatCompletionRequest(Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1, le=INT32_MAX)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = Field(None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None

    def refused(self) -> tuple[str, str] | None:
        base = super().refused()
        if base is not None:
            return base
        if self.top_logprobs is not None and not self.logprobs:
            return "top_logprobs", "top_logprobs needs logprobs: true"
        if self.response_format is not None and self.response_format.type == "json_schema" \
                and self.response_format.json_schema is None:
            return "response_format.json_schema", "required when response_format.type is json_schema"
        if self.tool_choice is not None and self.tool_choice != "none" and not self.tools:
            return "tool_choice", "tool_choice needs tools"
        for i, m in enumerate(self.messages):
            if m.name is not None and m.role != "tool":
                return f"messages[{i}].name", "participant names are not supported (the chat template has no place for them)"
        return None


class CompletionRequest(Sampling):
    prompt: str | list[str]
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=20)
    best_of: int | None = Field(None, ge=1, le=128)
    suffix: str | None = None

    def prompts(self) -> list[str]:
        return [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)

    def refused(self) -> tuple[str, str] | None:
        base = super().refused()
        if base is not None:
            return base
        if self.suffix is not None:
            return "suffix", "suffix (insertion) is not supported"
        if self.best_of is not None and self.best_of != self.n:
            return "best_of", "best_of is not supported (omit it or set it equal to n)"
        if not self.prompts():
            return "prompt", "at least one prompt is required"
        if any(p == "" for p in self.prompts()):
            return "prompt", "empty prompt"
        if self.echo and self.logprobs is not None:
            return "echo", "echo with logprobs is not supported (the prompt's logprobs are not computed)"
        return None


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """OpenAI's error body (errors.py); documented in /openapi.json for every status a route may answer."""

    error: ErrorDetail
