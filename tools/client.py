"""Stream a completion from the ensemble over gRPC (KServe v2 streaming) to the terminal.

    python -m tools.client "def fibonacci(n):" --max-tokens 64
    python -m tools.client "record = " --json-schema person.schema.json --max-tokens 96
    python -m tools.client "date: " --regex "[0-9]{4}-[0-9]{2}-[0-9]{2}"
    python -m tools.client --chat "Write a haiku about tests" --max-tokens 48 --temperature 0.7
    llm-client "import os" --stop "\\n\\n" --url localhost:8001

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
    "include_stop_str_in_output": "BOOL", "stop": "BOOL",
}
LIST_INPUTS = ("stop_words", "bad_words")
OUTPUTS = ("text_output", "finish_reason", "cum_log_probs", "output_log_probs", "num_input_tokens",
           "num_output_tokens", "sequence_index")
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
                 tuple(lps.reshape(-1).tolist()) if lps is not None else ())


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


def guide_options(args: argparse.Namespace) -> dict[str, str]:
    """The guided-decoding inputs for ``--json``, ``--json-schema FILE``, ``--regex`` or ``--grammar FILE``."""
    from pathlib import Path

    if args.json:
        return {"guided_decoding_guide_type": "json"}
    if args.json_schema:
        return {"guided_decoding_guide_type": "json_schema",
                "guided_decoding_guide": Path(args.json_schema).read_text(encoding="utf-8")}
    if args.regex:
        return {"guided_decoding_guide_type": "regex", "guided_decoding_guide": args.regex}
    if args.grammar:
        return {"guided_decoding_guide_type": "ebnf_grammar",
                "guided_decoding_guide": Path(args.grammar).read_text(encoding="utf-8")}
    return {}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Stream a completion from the Triton ensemble.")
    ap.add_argument("prompt")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--url", default="localhost:8001", help="gRPC endpoint (default localhost:8001)")
    ap.add_argument("--model", default="ensemble")
    ap.add_argument("--chat", action="store_true", help="send the prompt as a user message (chat template)")
    ap.add_argument("--temperature", type=float)
    ap.add_argument("--top-k", type=int)
    ap.add_argument("--top-p", type=float)
    ap.add_argument("--seed", type=int)
    ap.add_argument("--stop", action="append", help="stop string (repeatable)")
    ap.add_argument("--echo", action="store_true", help="print the prompt before the completion")
    guided = ap.add_mutually_exclusive_group()  # constrained decoding (docs/api.md, "Guided decoding")
    guided.add_argument("--json", action="store_true", help="constrain the output to any JSON value")
    guided.add_argument("--json-schema", metavar="FILE", help="constrain the output to this JSON schema")
    guided.add_argument("--regex", metavar="PATTERN", help="constrain the output to match this pattern in full")
    guided.add_argument("--grammar", metavar="FILE", help="constrain the output to this EBNF grammar (root rule)")
    args = ap.parse_args(argv)
    options: dict[str, Any] = {"exclude_input_in_output": True, "temperature": args.temperature,
                               "top_k": args.top_k, "top_p": args.top_p, "seed": args.seed,
                               "stop_words": args.stop, "return_num_output_tokens": True}
    options.update(guide_options(args))
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


if __name__ == "__main__":
    sys.exit(main())
