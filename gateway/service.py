"""``triton_llm.v1.LLMService`` on grpcio's asyncio server, forwarding Generate to Triton's ensemble."""
from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid
from pathlib import Path

import grpc
from google.rpc import code_pb2, error_details_pb2, status_pb2

from triton_llm.v1 import llm_service_pb2 as pb
from triton_llm.v1 import llm_service_pb2_grpc as pb_grpc

from . import mapping
from .config import TokenSet
from .generation import Generation, StreamCloser
from .stream_buffer import DEFAULT_CAP_BYTES
from .tracing import GatewayTracing, generate_attributes, usage_attributes
from .upstream import TritonUpstream

log = logging.getLogger("gateway")

TRACE_HEADERS = ("traceparent", "tracestate")
MAX_TOKENIZE_BYTES = 1_000_000


async def abort(context: grpc.aio.ServicerContext, code: grpc.StatusCode, message: str,
                field: str | None = None, retry_after_s: float | None = None) -> None:
    """End the call with ``code``; INVALID_ARGUMENT also carries a google.rpc.BadRequest naming the field,
    a refusal to retry later (RESOURCE_EXHAUSTED) a google.rpc.RetryInfo with the delay."""
    details = []
    if field is not None:
        details.append(error_details_pb2.BadRequest(field_violations=[
            error_details_pb2.BadRequest.FieldViolation(field=field, description=message)]))
    if retry_after_s is not None:
        info = error_details_pb2.RetryInfo()
        info.retry_delay.FromMilliseconds(int(retry_after_s * 1000))
        details.append(info)
    trailing = ()
    if details:
        status = status_pb2.Status(code=getattr(code_pb2, code.name), message=message)
        for detail in details:
            status.details.add().Pack(detail)
        trailing = (("grpc-status-details-bin", status.SerializeToString()),)
    await context.abort(code, message, trailing_metadata=trailing)


def _metadata(context: grpc.aio.ServicerContext) -> dict[str, str]:
    out = {}
    for key, value in context.invocation_metadata() or ():
        if isinstance(value, str):
            out[key.lower()] = value
    return out


def traced_unary(method: str):
    """A unary handler with the gateway's server span around it when tracing is on (gateway/tracing.py)."""
    def wrap(handler):
        @functools.wraps(handler)
        async def traced(self: LLMService, request, context: grpc.aio.ServicerContext):
            span = self.tracing.start(method, _metadata(context), time.time_ns()) if self.tracing is not None else None
            if span is None:
                return await handler(self, request, context)
            try:
                return await handler(self, request, context)
            except BaseException as e:
                span.failed(e, context)
                raise
            finally:
                span.end()
        return traced
    return wrap


class LLMService(pb_grpc.LLMServiceServicer):
    def __init__(self, upstream: TritonUpstream, *, tokens: TokenSet | None = None, max_inflight: int = 256,
                 tracing: GatewayTracing | None = None, stream_buffer_bytes: int = DEFAULT_CAP_BYTES) -> None:
        self.upstream = upstream
        self.tracing = tracing        # the server spans when OTEL_* turns tracing on (gateway/tracing.py), else None
        self.tokens = tokens
        self.max_inflight = max_inflight
        self.stream_buffer_bytes = stream_buffer_bytes   # per stream (gateway/stream_buffer.py)
        self.inflight = 0
        self._tokenizers: dict[Path, object] = {}
        self.closer = StreamCloser()

    # ---- cross-cutting ----------------------------------------------------------------------------
    async def _authorize(self, context: grpc.aio.ServicerContext) -> dict[str, str]:
        md = _metadata(context)
        if self.tokens is not None and self.tokens.enabled:
            auth = md.get("authorization", "")
            scheme, _, token = auth.partition(" ")
            if not auth:
                await abort(context, grpc.StatusCode.UNAUTHENTICATED,
                            "missing credentials: send metadata 'authorization: Bearer <token>'")
            if scheme.lower() != "bearer" or not token.strip() or not self.tokens.check(token.strip()):
                await abort(context, grpc.StatusCode.UNAUTHENTICATED, "invalid bearer token")
        return md

    # ---- Generate ---------------------------------------------------------------------------------
    async def Generate(self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext):
        span = self.tracing.start("Generate", _metadata(context), time.time_ns()) if self.tracing is not None else None
        try:
            md = await self._authorize(context)
            if self.inflight >= self.max_inflight:
                await abort(context, grpc.StatusCode.RESOURCE_EXHAUSTED,
                            f"too many Generate calls in flight (limit {self.max_inflight}); retry later",
                            retry_after_s=mapping.QUEUE_RETRY_AFTER_S)
            self.inflight += 1
            try:
                try:
                    if request.request_id:
                        mapping.validate_request_id(request.request_id)
                    rid = request.request_id or uuid.uuid4().hex
                    generation = Generation(self.upstream, request, rid, self.closer, self.stream_buffer_bytes)
                except mapping.FieldError as e:
                    await abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(e), e.field)
                    return
                if span is not None:
                    span.attributes.update(generate_attributes(request, rid, self.upstream.served_name,
                                                               self.upstream.model))
                if not self.upstream.ready:
                    await abort(context, grpc.StatusCode.UNAVAILABLE,
                                f"Triton's {self.upstream.model!r} model at {self.upstream.url} is not ready; retry")
                if span is None:
                    upstream_md = tuple((k, md[k]) for k in TRACE_HEADERS if k in md)
                else:   # Triton's spans become children of the gateway's
                    upstream_md = span.upstream_metadata()
                try:
                    async with contextlib.aclosing(generation.responses(upstream_md, context.time_remaining())) as outs:
                        async for out in outs:
                            yield out
                except mapping.UpstreamError as e:
                    await abort(context, e.code, e.message, e.field, e.retry_after_s)
                finally:
                    if span is not None:
                        span.attributes.update(usage_attributes(generation.assembler))
            finally:
                self.inflight -= 1
        except BaseException as e:
            if span is not None:
                span.failed(e, context)
            raise
        finally:
            if span is not None:
                span.end()

    # ---- Tokenize ---------------------------------------------------------------------------------
    def tokenizer(self, path: Path):
        """The tokenizer of the checkpoint at ``path``, loaded once (Tokenize; the HTTP API's logprobs)."""
        tok = self._tokenizers.get(path)
        if tok is None:
            from preprocess import load_tokenizer

            tok = self._tokenizers[path] = load_tokenizer(path)
        return tok

    @traced_unary("Tokenize")
    async def Tokenize(self, request: pb.TokenizeRequest, context: grpc.aio.ServicerContext) -> pb.TokenizeResponse:
        await self._authorize(context)
        case = request.WhichOneof("input")
        if case is None:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, "text: required: set text or messages", "text")
        size = len(request.text.encode("utf-8")) if case == "text" else request.messages.ByteSize()
        if size > MAX_TOKENIZE_BYTES:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT,
                        f"{case}: too large: {size} bytes (limit {MAX_TOKENIZE_BYTES})", case)
        facts = await self._facts(context)
        if facts.tokenizer_path is None:
            await abort(context, grpc.StatusCode.FAILED_PRECONDITION,
                        "the gateway cannot find the model's tokenizer (set --tokenizer-path)")
        try:
            tok = await asyncio.to_thread(self.tokenizer, facts.tokenizer_path)
        except Exception as e:  # TokenizerError names the file
            log.error("Tokenize: cannot load the tokenizer: %s", e)
            await abort(context, grpc.StatusCode.FAILED_PRECONDITION, f"cannot load the model's tokenizer: {e}")
        if case == "text":
            add = request.add_special_tokens if request.HasField("add_special_tokens") else True
            prompt = request.text
            ids = await asyncio.to_thread(tok.encode, prompt, add)
        else:
            prompt = await self._render_chat(tok, request.messages, context)
            ids = await asyncio.to_thread(tok.encode, prompt, False)  # the template writes BOS
        return pb.TokenizeResponse(token_ids=ids, token_count=len(ids), prompt=prompt,
                                   max_context_tokens=facts.max_context_tokens)

    async def _render_chat(self, tok, messages: pb.ChatMessages, context) -> str:
        from preprocess import ChatTemplate, ChatTemplateError

        if not messages.messages:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, "messages: at least one message is required",
                        "messages")
        for i, m in enumerate(messages.messages):
            if not m.role:
                path = f"messages.messages[{i}].role"
                await abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"{path}: must not be empty", path)
        if not tok.chat_template:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT,
                        "messages: this model has no chat_template; send text instead", "messages")
        try:
            template = ChatTemplate(tok.chat_template, tok.template_variables())
            return template.render([{"role": m.role, "content": m.content} for m in messages.messages],
                                   add_generation_prompt=True)
        except ChatTemplateError as e:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"messages: chat template: {e}", "messages")

    async def _facts(self, context):
        try:
            return await self.upstream.facts()
        except grpc.aio.AioRpcError:
            await abort(context, grpc.StatusCode.UNAVAILABLE, f"Triton at {self.upstream.url} is unavailable; retry")

    # ---- GetModelInfo -----------------------------------------------------------------------------
    async def _guide_probe(self) -> str | None:
        """One ``json``-guided request of one token: None if accepted, the error text if the engine
        rejects guided decoding; raises (not cached) on anything else."""
        probe = pb.GenerateRequest(prompt="{", max_tokens=1, temperature=0.0,
                                   guided_decoding=pb.GuidedDecoding(any_json=pb.GuidedDecoding.AnyJson()))
        call = self.upstream.stub.ModelStreamInfer(timeout=30.0)
        ended = False
        try:
            await call.write(mapping.build_infer_request(probe, "gateway-guide-probe-" + uuid.uuid4().hex[:8],
                                                         self.upstream.model))
            while True:
                resp = await call.read()
                if resp is grpc.aio.EOF:
                    raise RuntimeError("stream closed")
                if resp.error_message:
                    ended = True
                    err = mapping.map_triton_error(resp.error_message, probe, "probe")
                    if err.field and err.field.startswith("guided_decoding"):
                        return err.message
                    raise RuntimeError(resp.error_message)
                if mapping.is_final(resp.infer_response):
                    ended = True
                    return None
        finally:
            if ended:
                self.closer.release(call)
            else:
                call.cancel()

    @traced_unary("GetModelInfo")
    async def GetModelInfo(self, request: pb.GetModelInfoRequest, context: grpc.aio.ServicerContext) -> pb.ModelInfo:
        await self._authorize(context)
        if not self.upstream.ready:
            await abort(context, grpc.StatusCode.UNAVAILABLE,
                        f"Triton's {self.upstream.model!r} model at {self.upstream.url} is not ready; retry")
        facts = await self._facts(context)
        try:
            guides = await self.upstream.supported_guide_types(self._guide_probe)
        except Exception as e:
            log.warning("guided decoding probe failed: %s", e)
            guides = []
        method = {None: pb.SPECULATIVE_METHOD_UNSPECIFIED, "": pb.SPECULATIVE_METHOD_NONE,
                  "ngram": pb.SPECULATIVE_METHOD_NGRAM, "draft": pb.SPECULATIVE_METHOD_DRAFT_MODEL}
        return pb.ModelInfo(
            name=facts.name, triton_model=self.upstream.model, max_context_tokens=facts.max_context_tokens,
            vocab_size=facts.vocab_size, architecture=facts.architecture,
            supported_guide_types=[mapping.GUIDE_ENUM[g] for g in guides if g in mapping.GUIDE_ENUM],
            speculative_method=method.get(facts.speculative_method, pb.SPECULATIVE_METHOD_UNSPECIFIED),
            num_speculative_tokens=facts.num_speculative_tokens, quantization=facts.quantization,
            kv_cache_dtype=facts.kv_cache_dtype, lora_adapters=facts.lora_adapters)
