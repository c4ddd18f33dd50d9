"""OpenAI request parameters -> ``triton_llm.v1.GenerateRequest``, the typed request the gRPC API takes.

From there ``gateway.mapping`` makes the ensemble's tensors, so both APIs share one mapping of
parameters. OpenAI's meaning is kept: ``max_completion_tokens`` wins over ``max_tokens``; ``top_k``
-1 (vLLM's "off") is our 0; the prompt is never echoed by the ensemble (``exclude_input_in_output``:
``echo`` is the gateway's); token counts are always asked for (``usage``); a ``model`` naming a LoRA adapter
sets ``lora_name``. ``PARAM_OF`` names the
OpenAI parameter behind each proto field, for errors the ensemble reports.
"""
from __future__ import annotations

from triton_llm.v1 import llm_service_pb2 as pb

from .schemas import ChatCompletionRequest, CompletionRequest, Message, Sampling

# proto field (as mapping.UpstreamError.field names it) -> the OpenAI parameter
PARAM_OF = {"prompt": "prompt", "messages": "messages", "num_return_sequences": "n", "stop_words": "stop",
            "guided_decoding.json_schema": "response_format", "guided_decoding.any_json": "response_format",
            "guided_decoding": "response_format", "min_tokens": "min_tokens", "lora_name": "model"}
DEFAULT_COMPLETION_MAX_TOKENS = 16   # OpenAI's default for /v1/completions


def param_of(guide_param: str) -> dict[str, str]:
    """``PARAM_OF`` with the guide's fields renamed to where the guide came from (guides.OutputPlan.param)."""
    return {**PARAM_OF, **{k: guide_param for k in PARAM_OF if k.startswith("guided")}}


def sampling_fields(body: Sampling, max_tokens: int) -> dict:
    """The GenerateRequest fields that chat and completions set alike."""
    fields: dict = {"max_tokens": max_tokens, "stream": True, "exclude_input_in_output": True,
                    "return_num_input_tokens": True, "return_num_output_tokens": True}
    for name in ("temperature", "top_p", "seed", "presence_penalty", "frequency_penalty", "min_p",
                 "repetition_penalty", "min_tokens", "num_speculative_tokens"):
        value = getattr(body, name)
        if value is not None:
            fields[name] = value
    if body.top_k is not None:
        fields["top_k"] = max(body.top_k, 0)
    if body.n != 1:
        fields["num_return_sequences"] = body.n
    if body.ignore_eos:
        fields["ignore_eos"] = True
    if body.logit_bias:
        fields["logit_bias"] = body.token_biases()
    stop = body.stop_list()
    if stop:
        fields["stop_words"] = stop
    return fields


def chat_max_tokens(body: ChatCompletionRequest, context_tokens: int) -> int:
    """The request's own limit, else the model's context (the engine ends the sequence there: ``length``)."""
    for value in (body.max_completion_tokens, body.max_tokens):
        if value is not None:
            return value
    return max(context_tokens, 1)


def chat_request(body: ChatCompletionRequest, messages: list[Message], context_tokens: int,
                 guide: pb.GuidedDecoding | None) -> pb.GenerateRequest:
    """``messages`` are the ones rendered into the prompt (tools.prompt_messages may add a system one)."""
    req = pb.GenerateRequest(messages=pb.ChatMessages(messages=[
        pb.ChatMessage(role=m.role, content=m.text()) for m in messages]),
        **sampling_fields(body, chat_max_tokens(body, context_tokens)))
    if body.logprobs:
        req.return_log_probs = True
        if body.top_logprobs:
            req.top_logprobs = body.top_logprobs
    if guide is not None:
        req.guided_decoding.CopyFrom(guide)
    return req


def select_adapter(req: pb.GenerateRequest, model: str, adapters: list[str]) -> None:
    """A ``model`` that names a served LoRA adapter runs the request under it (vLLM's convention)."""
    if model in adapters:
        req.lora_name = model


def completion_request(body: CompletionRequest, prompt: str) -> pb.GenerateRequest:
    max_tokens = body.max_tokens if body.max_tokens is not None else DEFAULT_COMPLETION_MAX_TOKENS
    req = pb.GenerateRequest(prompt=prompt, **sampling_fields(body, max_tokens))
    if body.logprobs is not None:
        req.return_log_probs = True
        if body.logprobs:
            req.top_logprobs = body.logprobs
    return req
