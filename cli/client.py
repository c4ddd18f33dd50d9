"""Stream a completion from the ensemble over gRPC (KServe v2 streaming) to the terminal.

    python -m cli.client "def fibonacci(n):"                 # the prompt, then 64 greedy tokens
    python -m cli.client "def fibonacci(n):" --temperature 0.8 --top-p 0.95 --seed 1
    python -m cli.client --chat "Write a haiku about tests" --max-tokens 48
    llm-client "import os" --stop '\n\n' --url localhost:8001   # \n, \t and \\ in --stop are unescaped
    python -m cli.client "record = " --json-schema person.schema.json --max-tokens 96
    python -m cli.client "date: " --regex "[0-9]{4}-[0-9]{2}-[0-9]{2}"
    python -m cli.client "def f():" --gateway                # the typed API (gateway, localhost:50051)
    python -m cli.client "def f():" --ignore-eos --max-tokens 128 --logit-bias 17=-100   # fixed length, token 17 banned

Every flag works in both modes (the ensemble over KServe v2 gRPC, or ``--gateway``) except the
ones a mode cannot honour, which are refused naming the flag: ``--model`` with ``--gateway`` (the
gateway calls its own upstream model), ``--token`` and ``--tls-ca`` without it (tritonserver takes
neither). With no server at ``--url`` the error says that nothing listens there.

Defaults give the demo model's best output, as the README's samples: greedy with
``repetition_penalty`` 1.2. The gRPC port comes from ``GRPC_PORT`` as for ``make serve``.

``build_inputs`` turns Python values into the ensemble's typed inputs (TensorRT-LLM names); the
end-to-end tests use it too.
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import re
import socket
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
    "return_perf_metrics": "BOOL", "lora_name": "BYTES", "lora_task_id": "UINT64", "lora_weights": "FP16",
    "lora_config": "INT32", "top_logprobs": "INT32", "ignore_eos": "BOOL", "logit_bias": "BYTES",
}
LIST_INPUTS = ("stop_words", "bad_words")
OUTPUTS = ("text_output", "finish_reason", "cum_log_probs", "output_log_probs", "num_input_tokens",
           "num_output_tokens", "sequence_index", "acceptance_rate", "total_accepted_draft_tokens",
           "total_draft_tokens", "top_log_probs")
_NP = {"BYTES": np.object_, "INT32": np.int32, "UINT64": np.uint64, "FP32": np.float32, "BOOL": np.bool_,
       "FP16": np.float16}


def to_array(name: str, value: Any) -> np.ndarray:
    """A value as the ``[1, ...]`` array (batch of one) the ensemble expects for ``name``."""
    dtype = _NP[INPUT_TYPES[name]]
    if name in LIST_INPUTS:
        items = [value] if isinstance(value, (str, bytes)) else list(value)
        return np.asarray([[v.encode() if isinstance(v, str) else v for v in items]], dtype=dtype)
    if name in ("messages", "logit_bias") and not isinstance(value, (str, bytes)):
        value = json.dumps({str(k): v for k, v in value.items()} if isinstance(value, dict) else value)
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
    finished = False
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
            finished = chunk.final
            yield chunk
            if chunk.final:
                return
    finally:
        # cancel only a request still running: cancelling a finished one races Triton 2.51's ensemble
        # completion and can leave the ensemble unable to unload (docs/serving.md)
        client.stop_stream(cancel_requests=not finished)
        client.close()


# ---- sampling flags: every sampling input of the ensemble, with the demo's best defaults -----------
# (name on the command line, ensemble input, type, default, help). None: the server's default.
SAMPLING_FLAGS = (
    ("--max-tokens", "max_tokens", int, 64, "tokens to generate"),
    ("--temperature", "temperature", float, 0.0, "0 = greedy; e.g. 0.8 for sampled text"),
    ("--repetition-penalty", "repetition_penalty", float, 1.2, "1.0 = off; 1.2 keeps the demo model from looping"),
    ("--top-k", "top_k", int, None, "keep the k most likely tokens (server default 0: off)"),
    ("--top-p", "top_p", float, None, "nucleus sampling (server default 1.0: off)"),
    ("--min-p", "min_p", float, None, "drop tokens below min_p x the top probability (server default 0: off)"),
    ("--presence-penalty", "presence_penalty", float, None, "in [-2, 2] (server default 0)"),
    ("--frequency-penalty", "frequency_penalty", float, None, "in [-2, 2] (server default 0)"),
    ("--seed", "seed", int, None, "seed of a sampled request (reproducible output)"),
    ("--min-tokens", "min_tokens", int, None, "no EOS before this many tokens (server default 0)"),
    ("--end-id", "end_id", int, None, "an extra stop token id"),
    ("--n", "num_return_sequences", int, None, "sequences to sample (printed one after another)"),
    ("--num-speculative-tokens", "num_speculative_tokens", int, None,
     "this request's cap on drafts per step (0: no speculation; server default: the engine's)"),
    ("--lora", "lora_name", str, None, "the LoRA adapter to run under (server default: none, the base model)"),
)
LIST_FLAGS = (("--stop", "stop_words", "stop string (repeatable; \\n, \\t and \\\\ are unescaped)"),
              ("--bad-words", "bad_words", "a word never to generate (repeatable)"))
DEFAULT_URL = f"localhost:{os.environ.get('GRPC_PORT') or 8001}"


def token_bias(text: str) -> tuple[int, float]:
    """``--logit-bias 17=-100`` -> ``(17, -100.0)``; the server checks the id and the range."""
    token, sep, bias = text.partition("=")
    try:
        if not sep:
            raise ValueError
        return int(token), float(bias)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected TOKEN_ID=BIAS (e.g. 17=-100), got {text!r}") from None


def unescape(text: str) -> str:
    """``\\n`` -> newline, ``\\t`` -> tab, ``\\\\`` -> backslash (shells pass ``'\\n\\n'`` literally)."""
    return re.sub(r"\\([nt\\])", lambda m: {"n": "\n", "t": "\t", "\\": "\\"}[m.group(1)], text)


def add_sampling_flags(ap: argparse.ArgumentParser) -> None:
    for flag, _, typ, default, text in SAMPLING_FLAGS:
        ap.add_argument(flag, type=typ, default=default, help=text)
    for flag, _, text in LIST_FLAGS:
        ap.add_argument(flag, action="append", type=unescape, help=text)
    ap.add_argument("--ignore-eos", action="store_true", default=None,
                    help="EOS does not end the output: max_tokens, --end-id or a stop string does (fixed lengths)")
    ap.add_argument("--logit-bias", action="append", type=token_bias, metavar="TOKEN_ID=BIAS",
                    help="add BIAS (in [-100, 100]) to a token's logit before temperature: -100 bans it, +100 "
                         "forces it (repeatable)")


def sampling_options(args: argparse.Namespace) -> dict[str, Any]:
    """The ensemble inputs the sampling flags set (None where the server's default applies)."""
    opts = {name: getattr(args, flag[2:].replace("-", "_")) for flag, name, *_ in SAMPLING_FLAGS}
    opts.update({name: getattr(args, flag[2:].replace("-", "_")) for flag, name, _ in LIST_FLAGS})
    opts["ignore_eos"] = args.ignore_eos
    opts["logit_bias"] = dict(args.logit_bias) if args.logit_bias else None
    return opts


class _Defaults(argparse.ArgumentDefaultsHelpFormatter):
    """``(default: x)`` after each flag's help, except where the server's default applies (None)."""

    def _get_help_string(self, action):
        return action.help if action.default is None else super()._get_help_string(action)


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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description="Stream a completion from the Triton ensemble. The defaults give the demo model's best "
                    "output, as the README's samples: greedy with repetition_penalty 1.2.",
        formatter_class=_Defaults)
    ap.add_argument("prompt", help="the prompt (with --chat: the user's message)")
    ap.add_argument("--url", default=DEFAULT_URL, help="gRPC endpoint (port from $GRPC_PORT, as make serve)")
    ap.add_argument("--model", help="the Triton model to call (default: ensemble; not with --gateway, which "
                                    "calls the model it was started with)")
    ap.add_argument("--chat", action="store_true", help="send the prompt as a user message (chat template)")
    ap.add_argument("--echo", action=argparse.BooleanOptionalAction, default=True,
                    help="print the prompt before the completion (not with --chat)")
    ap.add_argument("--gateway", action="store_true",
                    help="use the typed API (triton_llm.v1.LLMService) through the gateway instead of the ensemble "
                         "(--url then defaults to localhost:$GATEWAY_PORT, 50051)")
    ap.add_argument("--token", help="bearer token for the gateway (default: $GATEWAY_TOKEN; only with --gateway)")
    ap.add_argument("--tls-ca", help="PEM CA certificate: connect to the gateway with TLS (only with --gateway)")
    guided = ap.add_mutually_exclusive_group()  # constrained decoding (docs/api.md, "Guided decoding")
    guided.add_argument("--json", action="store_true", help="constrain the output to any JSON value")
    guided.add_argument("--json-schema", metavar="FILE", help="constrain the output to this JSON schema")
    guided.add_argument("--regex", metavar="PATTERN", help="constrain the output to match this pattern in full")
    guided.add_argument("--grammar", metavar="FILE", help="constrain the output to this EBNF grammar (root rule)")
    add_sampling_flags(ap)
    args = ap.parse_args(argv)
    refused = mode_conflict(args)
    if refused:
        ap.error(refused)
    return args


def mode_conflict(args: argparse.Namespace) -> str | None:
    """Why a flag cannot work in the chosen mode (direct Triton or ``--gateway``), naming it; None when all can."""
    if args.gateway and args.model is not None:
        return "--model: the gateway calls the Triton model it was started with (--triton-model); drop --model"
    if not args.gateway:
        for flag, value in (("--token", args.token), ("--tls-ca", args.tls_ca)):
            if value is not None:
                return f"{flag}: only the gateway takes a token or TLS; add --gateway"
    return None


def nothing_listens(url: str, timeout: float = 1.0) -> str | None:
    """``"nothing listens on HOST:PORT (...)"`` when no TCP connection to ``url`` opens; None when one does
    (or when ``url`` names no port)."""
    host, _, port = url.rpartition(":")
    if not port.isdigit():
        return None
    host = host.strip("[]") or "localhost"
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return None
    except OSError as e:
        return f"nothing listens on {host}:{port} ({e.strerror or e})"


def error_text(error: BaseException, url: str, gateway: bool) -> str:
    """One line for a failed request: the server's message, or that no server is there and how to start one."""
    down = nothing_listens(url)
    if down:
        what = "the gateway (`make serve` starts it beside tritonserver)" if gateway else "tritonserver (`make serve`)"
        return f"{down}; start {what}, or point --url at a running one"
    code, details = getattr(error, "code", None), getattr(error, "details", None)
    if callable(code) and callable(details):     # grpc.RpcError from the gateway
        return f"{code().name}: {details()}"
    return getattr(error, "message", lambda: str(error))()    # tritonclient's InferenceServerException


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    options: dict[str, Any] = {**sampling_options(args), **guide_options(args)}
    if args.gateway:
        url = args.url if args.url != DEFAULT_URL else f"localhost:{os.environ.get('GATEWAY_PORT') or 50051}"
        chunks = gateway_chunks(args, url, options)
    else:
        url = args.url
        chunks = ensemble_chunks(args, options)
    if args.echo and not args.chat:
        print(args.prompt, end="", flush=True)
    n = options.get("num_return_sequences") or 1
    texts: dict[int, list[str]] = {}
    reasons: dict[int, str] = {}
    tokens: dict[int, int] = {}
    prompt_tokens = 0
    try:
        for chunk in chunks:
            if n == 1:
                print(chunk.text, end="", flush=True)
            texts.setdefault(chunk.sequence_index, []).append(chunk.text)
            reasons[chunk.sequence_index] = chunk.finish_reason or reasons.get(chunk.sequence_index, "")
            tokens[chunk.sequence_index] = chunk.num_output_tokens or tokens.get(chunk.sequence_index, 0)
            prompt_tokens = chunk.num_input_tokens or prompt_tokens
    except KeyboardInterrupt:
        print("\n[cancelled]", file=sys.stderr)
        return 130
    except Exception as e:  # an error response from the server, or no server
        print(f"\nerror: {error_text(e, url, args.gateway)}", file=sys.stderr)
        return 1
    for i in range(n) if n > 1 else ():
        print(f"\n--- sequence {i} ---\n" + "".join(texts.get(i, [])), end="", flush=True)
    summary = " ".join(f"[{'' if n == 1 else f'sequence {i}: '}finish_reason={reasons.get(i) or '?'} "
                       f"output_tokens={tokens.get(i, 0)}]" for i in range(n))
    print(f"\n{summary} [prompt_tokens={prompt_tokens}]", file=sys.stderr)
    return 0


def ensemble_chunks(args: argparse.Namespace, options: dict[str, Any]) -> Iterator[Chunk]:
    """The completion from the ensemble (or ``--model``) over KServe v2 streaming."""
    options = {"exclude_input_in_output": True, "return_num_output_tokens": True, "return_num_input_tokens": True,
               **options}
    max_tokens = options.pop("max_tokens")
    prompt = args.prompt
    if args.chat:
        options["messages"] = [{"role": "user", "content": args.prompt}]
        prompt = ""
    return stream(args.url, prompt, max_tokens, model=args.model or "ensemble", **options)


def gateway_chunks(args: argparse.Namespace, url: str, options: dict[str, Any]) -> Iterator[Chunk]:
    """The same completion through the gateway's typed API, as the ensemble's chunks."""
    from gateway.client import generate, generate_request
    from triton_llm.v1 import llm_service_pb2 as pb

    guide_type = options.pop("guided_decoding_guide_type", None)
    guide = options.pop("guided_decoding_guide", "")
    req = generate_request(args.prompt, chat=args.chat, guide_type=guide_type, guide=guide, stream=True,
                           exclude_input_in_output=True, **options)
    ca = open(args.tls_ca, "rb").read() if args.tls_ca else None
    for msg in generate(url, req, token=args.token or os.environ.get("GATEWAY_TOKEN"), root_certificates=ca):
        reason = pb.FinishReason.Name(msg.finish_reason).removeprefix("FINISH_REASON_").lower()
        yield Chunk(msg.text, "" if reason == "unspecified" else reason, msg.HasField("usage"),
                    msg.num_output_tokens, msg.sequence_index, msg.usage.prompt_tokens)


if __name__ == "__main__":
    sys.exit(main())
