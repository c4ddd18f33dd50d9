"""Pure translation between the typed API (triton_llm.v1) and the ensemble's KServe v2 tensors.

No I/O here: ``build_infer_request`` turns a ``GenerateRequest`` into one ``ModelInferRequest`` for
the ``ensemble`` (TensorRT-LLM tensor names, ``[1, 1]`` scalars and ``[1, N]`` lists, raw little-endian
contents); ``ResponseAssembler`` turns the ensemble's streamed responses into ``GenerateResponse``s;
``map_triton_error`` turns an ensemble error string (``"in ensemble 'ensemble', top_p: ..."``) into a
gRPC status code and a message that names the proto field.
"""
from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass, field

import grpc
from tritonclient.grpc import service_pb2

from preprocess.request import KNOWN_INPUTS
from triton_llm.v1 import llm_service_pb2 as pb

# proto field -> (ensemble input, Triton datatype) for the optional scalars, sent only when set.
OPTIONAL_SCALARS: dict[str, tuple[str, str]] = {
    "stream": ("stream", "BOOL"),
    "temperature": ("temperature", "FP32"),
    "top_p": ("top_p", "FP32"),
    "top_k": ("top_k", "INT32"),
    "min_p": ("min_p", "FP32"),
    "repetition_penalty": ("repetition_penalty", "FP32"),
    "presence_penalty": ("presence_penalty", "FP32"),
    "frequency_penalty": ("frequency_penalty", "FP32"),
    "seed": ("seed", "UINT64"),
    "end_id": ("end_id", "INT32"),
    "pad_id": ("pad_id", "INT32"),
    "min_tokens": ("min_tokens", "INT32"),
    "num_return_sequences": ("num_return_sequences", "INT32"),
    "beam_width": ("beam_width", "INT32"),
    "exclude_input_in_output": ("exclude_input_in_output", "BOOL"),
    "return_log_probs": ("return_log_probs", "BOOL"),
    "return_num_input_tokens": ("return_num_input_tokens", "BOOL"),
    "return_num_output_tokens": ("return_num_output_tokens", "BOOL"),
    "skip_special_tokens": ("skip_special_tokens", "BOOL"),
    "include_stop_str_in_output": ("include_stop_str_in_output", "BOOL"),
    "num_speculative_tokens": ("num_speculative_tokens", "INT32"),
    "top_logprobs": ("top_logprobs", "INT32"),
    "lora_name": ("lora_name", "BYTES"),
    "ignore_eos": ("ignore_eos", "BOOL"),
}
LIST_FIELDS: dict[str, str] = {"stop_words": "stop_words", "bad_words": "bad_words"}

# GuidedDecoding case -> the ensemble's guided_decoding_guide_type.
GUIDE_TYPES: dict[str, str] = {"json_schema": "json_schema", "any_json": "json", "regex": "regex",
                               "ebnf_grammar": "ebnf_grammar", "structural_tag": "structural_tag"}
GUIDE_ENUM: dict[str, int] = {"json_schema": pb.GUIDE_TYPE_JSON_SCHEMA, "json": pb.GUIDE_TYPE_ANY_JSON,
                              "regex": pb.GUIDE_TYPE_REGEX, "ebnf_grammar": pb.GUIDE_TYPE_EBNF_GRAMMAR,
                              "structural_tag": pb.GUIDE_TYPE_STRUCTURAL_TAG}

FINISH_REASONS: dict[str, int] = {
    "": pb.FINISH_REASON_UNSPECIFIED, "stop": pb.FINISH_REASON_STOP, "length": pb.FINISH_REASON_LENGTH,
    "abort": pb.FINISH_REASON_ABORT, "cancelled": pb.FINISH_REASON_ABORT,
}

# Ensemble inputs whose proto field has another name (the rest keep theirs).
_INPUT_TO_FIELD = {"text_input": "prompt", "min_length": "min_tokens"}
# Every input the ensemble validates (docs/api.md); an error "<one of these>: ..." is the client's.
ENSEMBLE_INPUTS = KNOWN_INPUTS
MAX_REQUEST_ID_CHARS = 128
_REQUEST_ID_RE = re.compile(r"[\x21-\x7e]+")


class FieldError(ValueError):
    """A request field the gateway itself rejects; ``field`` is its proto path."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


# ---- request -----------------------------------------------------------------------------------------

def _raw(dtype: str, values: list) -> bytes:
    if dtype == "BYTES":
        out = bytearray()
        for v in values:
            b = v.encode("utf-8") if isinstance(v, str) else bytes(v)
            out += struct.pack("<I", len(b)) + b
        return bytes(out)
    fmt = {"BOOL": "?", "INT32": "i", "FP32": "f", "UINT64": "Q"}[dtype]
    return struct.pack(f"<{len(values)}{fmt}", *values)


def add_input(req: service_pb2.ModelInferRequest, name: str, dtype: str, values: list) -> None:
    t = req.inputs.add()
    t.name = name
    t.datatype = dtype
    t.shape.extend([1, len(values)])
    req.raw_input_contents.append(_raw(dtype, values))


def validate_request_id(request_id: str) -> None:
    if len(request_id) > MAX_REQUEST_ID_CHARS:
        raise FieldError("request_id", f"at most {MAX_REQUEST_ID_CHARS} characters, got {len(request_id)}")
    if not _REQUEST_ID_RE.fullmatch(request_id):
        raise FieldError("request_id", "only printable ASCII characters without spaces are allowed")


def guide_case(request: pb.GenerateRequest) -> str | None:
    """The GuidedDecoding case set on ``request`` (``None`` when guided_decoding is absent)."""
    if not request.HasField("guided_decoding"):
        return None
    case = request.guided_decoding.WhichOneof("guide")
    if case is None:
        raise FieldError("guided_decoding", "set one of json_schema, any_json, regex, ebnf_grammar, structural_tag")
    return case


def ensemble_values(request: pb.GenerateRequest) -> list[tuple[str, str, list]]:
    """(input name, datatype, values) of every ensemble input the request sets, in a stable order.

    Raises ``FieldError`` for what only the typed API can get wrong (the ``input`` oneof, the guide
    oneof); every range and content check is left to the ensemble's preprocess, the one authority.
    """
    case = request.WhichOneof("input")
    if case is None:
        raise FieldError("prompt", "required: set prompt or messages")
    values: list[tuple[str, str, list]] = []
    if case == "prompt":
        values.append(("text_input", "BYTES", [request.prompt]))
    else:
        messages = [{"role": m.role, "content": m.content} for m in request.messages.messages]
        values.append(("text_input", "BYTES", [""]))  # required by the ensemble; ignored with messages
        values.append(("messages", "BYTES", [json.dumps(messages, ensure_ascii=False)]))
    values.append(("max_tokens", "INT32", [request.max_tokens]))
    for fname, (name, dtype) in OPTIONAL_SCALARS.items():
        if request.HasField(fname):
            values.append((name, dtype, [getattr(request, fname)]))
    for fname, name in LIST_FIELDS.items():
        items = list(getattr(request, fname))
        if items:
            values.append((name, "BYTES", items))
    if request.logit_bias:   # the ensemble's JSON object, ids in order; preprocess checks ids and biases
        bias = {str(t): request.logit_bias[t] for t in sorted(request.logit_bias)}
        values.append(("logit_bias", "BYTES", [json.dumps(bias, allow_nan=True)]))
    values.append(("return_perf_metrics", "BOOL", [True]))   # the speculative counts for Usage
    guide = guide_case(request)
    if guide is not None:
        text = "" if guide == "any_json" else getattr(request.guided_decoding, guide)
        values.append(("guided_decoding_guide_type", "BYTES", [GUIDE_TYPES[guide]]))
        values.append(("guided_decoding_guide", "BYTES", [text]))
    return values


def build_infer_request(request: pb.GenerateRequest, request_id: str, model: str = "ensemble"
                        ) -> service_pb2.ModelInferRequest:
    """The one ``ModelInferRequest`` a Generate call sends on its ``ModelStreamInfer`` stream."""
    req = service_pb2.ModelInferRequest(model_name=model, id=request_id)
    # Ask for an empty final response when the last data response was not flagged final, so the end
    # of every request is seen (tritonclient's aio stream_infer cannot set this reserved parameter).
    req.parameters["triton_enable_empty_final_response"].bool_param = True
    for name, dtype, vals in ensemble_values(request):
        add_input(req, name, dtype, vals)
    return req


# ---- responses ----------------------------------------------------------------------------------------

def _decode_bytes(raw: bytes) -> list[bytes]:
    out, i = [], 0
    while i + 4 <= len(raw):
        (n,) = struct.unpack_from("<I", raw, i)
        out.append(raw[i + 4:i + 4 + n])
        i += 4 + n
    return out


_NUMERIC = {"INT32": "i", "FP32": "f", "INT64": "q", "UINT64": "Q", "FP64": "d", "BOOL": "?"}
_ONE = {k: struct.Struct("<" + f) for k, f in _NUMERIC.items()}  # the common case: a [1, 1] scalar


def decode_outputs(resp: service_pb2.ModelInferResponse) -> dict[str, list]:
    """Output name -> flat list of values (``bytes`` for BYTES) of one response."""
    out: dict[str, list] = {}
    raws = resp.raw_output_contents
    for i, t in enumerate(resp.outputs):
        if i < len(raws):
            raw = raws[i]
            dtype = t.datatype
            if dtype == "BYTES":
                out[t.name] = _decode_bytes(raw)
            elif dtype in _ONE:
                one = _ONE[dtype]
                if len(raw) == one.size:
                    out[t.name] = [one.unpack(raw)[0]]
                else:
                    out[t.name] = list(struct.unpack(f"<{len(raw) // one.size}{_NUMERIC[dtype]}", raw))
        else:  # typed contents (not what Triton sends, but valid KServe v2)
            c = t.contents
            out[t.name] = list(c.bytes_contents or c.int_contents or c.fp32_contents or c.int64_contents
                               or c.uint64_contents or c.bool_contents or c.fp64_contents)
    return out


def is_final(resp: service_pb2.ModelInferResponse) -> bool:
    p = resp.parameters.get("triton_final_response")
    return True if p is None else p.bool_param


class UpstreamError(Exception):
    """The ensemble reported something the gateway turns into a gRPC status."""

    def __init__(self, code: grpc.StatusCode, message: str, field: str | None = None,
                 retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.field = field
        self.retry_after_s = retry_after_s   # a google.rpc.RetryInfo delay (HTTP: Retry-After) when set


@dataclass
class _Sequence:
    output_tokens: int = 0
    finish_reason: str = ""        # the ensemble's, once it says one
    draft_tokens: int = 0
    accepted_draft_tokens: int = 0


@dataclass
class ResponseAssembler:
    """Turns one request's ensemble responses into GenerateResponses; usage goes on the last one."""

    request_id: str
    prompt_tokens: int = 0
    sequences: dict[int, _Sequence] = field(default_factory=dict)
    last_index: int = 0
    finished: bool = False

    def usage(self) -> pb.Usage:
        completion = sum(s.output_tokens for s in self.sequences.values())
        return pb.Usage(prompt_tokens=self.prompt_tokens, completion_tokens=completion,
                        total_tokens=self.prompt_tokens + completion,
                        draft_tokens=sum(s.draft_tokens for s in self.sequences.values()),
                        accepted_draft_tokens=sum(s.accepted_draft_tokens for s in self.sequences.values()))

    def on_response(self, resp: service_pb2.ModelInferResponse) -> pb.GenerateResponse | None:
        """The GenerateResponse for one ensemble response (``None``: nothing to send); sets ``finished``."""
        final = is_final(resp)
        values = decode_outputs(resp) if resp.outputs else {}
        msg = None
        if values:
            idx = int(values["sequence_index"][0]) if values.get("sequence_index") else 0
            self.last_index = idx
            seq = self.sequences.setdefault(idx, _Sequence())
            if values.get("num_input_tokens"):
                self.prompt_tokens = max(self.prompt_tokens, int(values["num_input_tokens"][0]))
            if values.get("num_output_tokens"):
                seq.output_tokens = max(seq.output_tokens, int(values["num_output_tokens"][0]))
            if values.get("total_draft_tokens"):
                seq.draft_tokens = int(values["total_draft_tokens"][0])
            if values.get("total_accepted_draft_tokens"):
                seq.accepted_draft_tokens = int(values["total_accepted_draft_tokens"][0])
            elif values.get("acceptance_rate") and seq.draft_tokens:
                seq.accepted_draft_tokens = round(float(values["acceptance_rate"][0]) * seq.draft_tokens)
            reason_raw = values.get("finish_reason") or [b""]
            reason = reason_raw[0].decode("utf-8", "replace") if isinstance(reason_raw[0], bytes) else str(reason_raw[0])
            if reason == "error":
                raise UpstreamError(grpc.StatusCode.INTERNAL, "the engine reported an error")
            if reason:
                seq.finish_reason = reason
            text = b"".join(values.get("text_output") or ()).decode("utf-8", "replace")
            msg = pb.GenerateResponse(text=text, sequence_index=idx, request_id=self.request_id,
                                      finish_reason=FINISH_REASONS.get(reason, pb.FINISH_REASON_UNSPECIFIED),
                                      num_output_tokens=seq.output_tokens)
            lps = values.get("output_log_probs")
            if lps:
                msg.log_probs.extend(lps)
                cum = values.get("cum_log_probs")
                if cum:
                    msg.cum_log_prob = float(cum[0])
                tops = values.get("top_log_probs")
                if tops and tops[0]:
                    msg.top_log_probs.extend(top_log_probs(tops[0]))
            for name in ("output_ids", "token_ids"):  # not an ensemble output today (reserved field)
                if values.get(name):
                    msg.token_ids.extend(int(v) for v in values[name])
        if final:
            self.finished = True
            if msg is None:
                msg = pb.GenerateResponse(sequence_index=self.last_index, request_id=self.request_id)
            msg.usage.CopyFrom(self.usage())
        return msg


def top_log_probs(raw: bytes) -> list[pb.TopLogprobs]:
    """The ensemble's ``top_log_probs`` JSON (postprocess/top_logprobs.py) as messages."""
    return [pb.TopLogprobs(candidates=[pb.TokenLogprob(token_id=c["token_id"], token=c["token"],
                                                       log_prob=c["logprob"]) for c in token])
            for token in json.loads(raw)]


# ---- errors ---------------------------------------------------------------------------------------------

_PREFIX = re.compile(r"^(?:in ensemble '[^']*', )+")
_FIELD = re.compile(r"^([a-z_]+): (.*)$", re.S)
_UNAVAILABLE = re.compile(r"unknown model|not ready|no available versions|is not found|"
                          r"server is (?:stopping|shutting down|exiting)|unavailable", re.I)
_DEADLINE = re.compile(r"timeout|deadline", re.I)
_CANCELLED = re.compile(r"\bcancel", re.I)
_QUEUE_FULL = re.compile(r"\bmax_queued_requests: ")
QUEUE_RETRY_AFTER_S = 1.0      # the delay a refused request is told to wait (the engine frees slots every step)


def field_for_input(name: str, request: pb.GenerateRequest) -> str:
    """The proto field path that an ensemble input name stands for in ``request``."""
    if name in ("guided_decoding_guide_type", "guided_decoding_guide"):
        case = request.guided_decoding.WhichOneof("guide") if request.HasField("guided_decoding") else None
        return f"guided_decoding.{case}" if case else "guided_decoding"
    if name == "text_input" and request.WhichOneof("input") == "messages":
        return "messages"
    return _INPUT_TO_FIELD.get(name, name)


def map_triton_error(message: str, request: pb.GenerateRequest, request_id: str) -> UpstreamError:
    """An ensemble error string as a status: client errors name the proto field; the rest is INTERNAL
    with the request id (the upstream text is logged by the caller, never returned)."""
    text = _PREFIX.sub("", message.strip())
    if _QUEUE_FULL.search(text):   # the engine's queue cap (backend/engine/inbox.py queue_full_error)
        return UpstreamError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                             "the engine is full (max_queued_requests requests wait already); retry later",
                             retry_after_s=QUEUE_RETRY_AFTER_S)
    m = _FIELD.match(text)
    if m and m.group(1) in ENSEMBLE_INPUTS:
        path = field_for_input(m.group(1), request)
        rest = m.group(2)
        # The rest of the message may name other inputs (e.g. "must not exceed max_tokens"): those keep
        # their names except text_input / min_length / the guide inputs, rewritten for clarity.
        rest = re.sub(r"\bguided_decoding_guide(?:_type)?\b", "guided_decoding", rest)
        return UpstreamError(grpc.StatusCode.INVALID_ARGUMENT, f"{path}: {rest}", field=path)
    if _UNAVAILABLE.search(text):
        return UpstreamError(grpc.StatusCode.UNAVAILABLE, f"the model is not available: {text}")
    if _CANCELLED.search(text):
        return UpstreamError(grpc.StatusCode.CANCELLED, "the request was cancelled")
    if _DEADLINE.search(text):
        return UpstreamError(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline exceeded")
    return UpstreamError(grpc.StatusCode.INTERNAL, f"internal error (request id {request_id})")


def map_rpc_error(code: grpc.StatusCode, details: str, request_id: str, triton_url: str) -> UpstreamError:
    """A failure of the upstream gRPC call itself (connection refused, reset, deadline)."""
    if code == grpc.StatusCode.UNAVAILABLE:
        return UpstreamError(code, f"Triton at {triton_url} is unavailable; retry (request id {request_id})")
    if code in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED):
        return UpstreamError(code, "deadline exceeded" if code == grpc.StatusCode.DEADLINE_EXCEEDED
                             else "the request was cancelled")
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return UpstreamError(code, f"Triton is out of resources: {details}")
    return UpstreamError(grpc.StatusCode.INTERNAL, f"internal error (request id {request_id})")
