"""Stream a completion from the ensemble over gRPC (KServe v2 streaming) to the terminal.

    python -m tools.client "def fibonacci(n):" --max-tokens 64
    python -m tools.client --chat "Write a haiku about tests" --max-tokens 48 --temperature 0.7
    llm-client "import os" --stop "\\n\\n" --url localhost:8001
    python -m tools.client "def f():" --gateway          # the typed API (gateway, localhost:50051)

``build_inputs`` turns Python values into the ensemble's typed inputs (TensorRT-LLM names); the
end-to-end tests use it too.
"""
from __future__ import annotations

import argparse
import json
import queue
import sys
import uuid
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

# The ensemble's inputs and their Triton types (model_repository/ensemble/config.pbtxt).
INPUT_TYPES: dict[str, str] = {
    "text_input": "BYTES", "max_tokens": "INT32", "stream": "BOOL", "temperature": "FP32", "top_k": "INT32",
    "top_p": "FP32", "min_p": "FP32", "repetition_penalty": "FP32", "presence_penalty": "FP32",
    "frequency_penalty": "FP32", "seed": "UINT64", "stop_words": "BYTES", "bad_words": "BYTES", "end_id": "INT32",
    "pad_id": "INT32", "min_tokens": "INT32", "min_length": "INT32", "num_return_sequences": "INT32",
    "beam_width": "INT32", "exclude_input_in_output": "BOOL", "return_log_probs": "BOOL",
    "return_num_input_tokens": "BOOL", "return_num_output_tokens": "BOOL", "guided_decoding_guide_type": "BYTES",
    "guided_decoding_guide": "BYTES", "messages": "BYTES", "skip_special_tokens": "BOOL",
    "include_stop_str_in_output": "BOOL", "stop": "BOOL", "num_speculative_tokens": "INT32",
    "return_perf_metrics": "BOOL",
}
LIST_INPUTS = ("stop_words", "bad_words")
OUTPUTS = ("text_output", "finish_reason", "cum_log_probs", "output_log_probs", "num_input_tokens",
           "num_output_tokens", "sequence_index", "acceptance_rate", "total_accepted_draft_tokens",
           "total_draft_tokens")
_NP = {"BYTES": np.object_, "INT32": np.int32, "UINT64": np.uint64, "FP32": np.float32, "BOOL": np.bool_}


def to_array(name: str, value: Any) -> np.ndarray:
    """A value as the ``[1, ...]`` array (batch of one) the ensemble expects for ``name``."""
    dtype = _NP[INPUT_TYPES[name]]
    if name in LIST_INPUTS:
        items = [value] if isinstance(value, (str, bytes)) else list(value)
        return np.asarray([[v.encode() if isinstance(v, str) else v for v in items]], dtype=dtype)
    if name == "messages" and not isinstance(value, (str, bytes)):
        value = json.dumps(value)
    if isinstance(value, str):
        value = value.encode()
    return np.asarray([[value]], dtype=dtype)


def build_inputs(prompt: str | bytes, max_tokens: int, **options: Any) -> list:
    """InferInputs for one request: ``build_inputs("def f(", 32, stream=True, stop_words=["\\n"])``."""
    import tritonclient.grpc as grpcclient

    values = {"text_input": prompt, "max_tokens": max_tokens, **options}
    unknown = sorted(set(values) - set(INPUT_TYPES))
    if unknown:
        raise ValueError(f"unknown ensemble inputs: {unknown}")
    inputs = []
    for name, value in values.items():
        if value is None:
            continue
        arr = to_array(name, value)
        inp = grpcclient.InferInput(name, list(arr.shape), INPUT_TYPES[name])
        inp.set_data_from_numpy(arr)
        inputs.append(inp)
    return inputs


@dataclass
class Chunk:
    """One streamed response."""

    text: str
    finish_reason: str
    final: bool
    num_output_tokens: int = 0
    sequence_index: int = 0
    num_input_tokens: int = 0
    cum_log_prob: float = 0.0
    log_probs: tuple[float, ...] = ()
    acceptance_rate: float = 0.0           # speculative decoding, with return_perf_metrics
    total_accepted_draft_tokens: int = 0
    total_draft_tokens: int = 0


def parse_result(result) -> Chunk:
    resp = result.get_response()
    final = resp.parameters["triton_final_response"].bool_param if "triton_final_response" in resp.parameters else True
    if not resp.outputs:  # the empty final response that closes a decoupled stream
        return Chunk("", "", final)

    def scalar(name, default):
        arr = result.as_numpy(name)
        return default if arr is None or arr.size == 0 else arr.reshape(-1)[0]

    text = b"".join(result.as_numpy("text_output").reshape(-1).tolist()).decode("utf-8", "replace")
    reason = scalar("finish_reason", b"")
    lps = result.as_numpy("output_log_probs")
    return Chunk(text, reason.decode() if isinstance(reason, bytes) else str(reason), final,
                 int(scalar("num_output_tokens", 0)), int(scalar("sequence_index", 0)),
                 int(scalar("num_input_tokens", 0)), float(scalar("cum_log_probs", 0.0)),
                 tuple(lps.reshape(-1).tolist()) if lps is not None else (),
                 float(scalar("acceptance_rate", 0.0)), int(scalar("total_accepted_draft_tokens", 0)),
                 int(scalar("total_draft_tokens", 0)))


def stream(url: str, prompt: str, max_tokens: int, *, model: str = "ensemble", timeout: float = 600.0,
           **options: Any) -> Iterator[Chunk]:
    """Yield the chunks of one streamed request until its final response; raises on an error response."""
    import tritonclient.grpc as grpcclient

    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        client.async_stream_infer(model, build_inputs(prompt, max_tokens, stream=True, **options),
                                  request_id=uuid.uuid4().hex, outputs=[grpcclient.InferRequestedOutput(o)
                                                                        for o in OUTPUTS],
                                  enable_empty_final_response=True)
        while True:
            result, error = responses.get(timeout=timeout)
            if error is not None:
                raise error
            chunk = parse_result(result)
            yield chunk
            if chunk.final:
                return
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Stream a completion from the Triton ensemble.")
    ap.add_argument("prompt")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--url", help="gRPC endpoint (default localhost:8001, or localhost:50051 with --gateway)")
    ap.add_argument("--gateway", action="store_true",
                    help="use the typed API (triton_llm.v1.LLMService) through the gateway instead of the ensemble")
    ap.add_argument("--token", help="bearer token for the gateway (default: $GATEWAY_TOKEN)")
    ap.add_argument("--tls-ca", help="PEM CA certificate: connect to the gateway with TLS")
    ap.add_argument("--model", default="ensemble")
    ap.add_argument("--chat", action="store_true", help="send the prompt as a user message (chat template)")
    ap.add_argument("--temperature", type=float)
    ap.add_argument("--top-k", type=int)
    ap.add_argument("--top-p", type=float)
    ap.add_argument("--seed", type=int)
    ap.add_argument("--stop", action="append", help="stop string (repeatable)")
    ap.add_argument("--echo", action="store_true", help="print the prompt before the completion")
    args = ap.parse_args(argv)
    if args.gateway:
        return gateway_main(args)
    args.url = args.url or "localhost:8001"
    options: dict[str, Any] = {"exclude_input_in_output": True, "temperature": args.temperature,
                               "top_k": args.top_k, "top_p": args.top_p, "seed": args.seed,
                               "stop_words": args.stop, "return_num_output_tokens": True}
    prompt = args.prompt
    if args.chat:
        options["messages"] = [{"role": "user", "content": args.prompt}]
        prompt = ""
    if args.echo and not args.chat:
        print(args.prompt, end="", flush=True)
    reason, tokens = "", 0
    try:
        for chunk in stream(args.url, prompt, args.max_tokens, model=args.model, **options):
            print(chunk.text, end="", flush=True)
            reason = chunk.finish_reason or reason
            tokens = chunk.num_output_tokens or tokens
    except KeyboardInterrupt:
        print("\n[cancelled]", file=sys.stderr)
        return 130
    except Exception as e:  # an error response from the server, or no server
        print(f"\nerror: {getattr(e, 'message', lambda: str(e))()}", file=sys.stderr)
        return 1
    print(f"\n[finish_reason={reason or '?'} output_tokens={tokens}]", file=sys.stderr)
    return 0


def gateway_main(args) -> int:
    """The same completion through the gateway's typed API."""
    import os

    import grpc

    from gateway.client import generate
    from triton_llm.v1 import llm_service_pb2 as pb

    req = pb.GenerateRequest(max_tokens=args.max_tokens, stream=True, exclude_input_in_output=True,
                             stop_words=args.stop or [])
    if args.chat:
        req.messages.messages.add(role="user", content=args.prompt)
    else:
        req.prompt = args.prompt
    for name in ("temperature", "top_k", "top_p", "seed"):
        if getattr(args, name) is not None:
            setattr(req, name, getattr(args, name))
    if args.echo and not args.chat:
        print(args.prompt, end="", flush=True)
    ca = open(args.tls_ca, "rb").read() if args.tls_ca else None
    last = None
    try:
        for msg in generate(args.url or "localhost:50051", req, token=args.token or os.environ.get("GATEWAY_TOKEN"),
                            root_certificates=ca):
            print(msg.text, end="", flush=True)
            last = msg
    except KeyboardInterrupt:
        print("\n[cancelled]", file=sys.stderr)
        return 130
    except grpc.RpcError as e:
        print(f"\nerror: {e.code().name}: {e.details()}", file=sys.stderr)
        return 1
    reason = pb.FinishReason.Name(last.finish_reason).removeprefix("FINISH_REASON_").lower() if last else "?"
    usage = last.usage if last is not None else pb.Usage()
    print(f"\n[finish_reason={reason} prompt_tokens={usage.prompt_tokens} output_tokens={usage.completion_tokens}]",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
