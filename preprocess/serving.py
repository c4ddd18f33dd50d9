"""The ``preprocess`` Triton model's glue: Triton inputs -> ``RequestParser`` -> tensors for ``llm``.

One response per request (dynamic batching hands several at once). A client error becomes a
``TritonError`` whose message starts with the input's name. ``pb_utils`` is passed in, so this
runs in tests without the server.

Conventions at this boundary:
- ``stop=true`` (TensorRT-LLM's cancel input) skips validation: the llm model aborts the request
  whose id this request carries, so only the flag travels on;
- request parameters are refused, naming them (``check_no_parameters``): over HTTP they are the JSON
  keys of ``generate`` that are no input;
- ``text_input`` and ``max_tokens`` are optional in ``config.pbtxt`` so that a request lacking them gets
  the parser's error naming the input (Triton's decoupled ensemble would close the stream silently); a
  chat request sends ``messages`` alone, or with an empty ``text_input`` (TensorRT-LLM clients), which is
  then ignored.
"""
from __future__ import annotations

import dataclasses
import difflib
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np

from contracts import wire
from contracts.triton_config import (
    DEFAULT_TOKENIZER,
    check_known_parameters,
    model_parameters,
    resolve_path,
    str_param,
)
from preprocess.errors import RequestError
from preprocess.request import KNOWN_INPUTS, RequestLimits, RequestParser
from preprocess.tokenizer import load_tokenizer
from tracing import TracedServing

log = logging.getLogger(__name__)
# every parameter the preprocess model reads (the tokenizer, the request limits); any other fails its load
PREPROCESS_PARAMETERS = frozenset({"tokenizer_path"} | {f.name for f in dataclasses.fields(RequestLimits)})


class PreprocessServing(TracedServing):
    def __init__(self, parser: RequestParser, pb_utils, input_names: list[str], tracer=None):
        self.parser = parser
        self.pb = pb_utils
        self.input_names = list(input_names)
        self.tracing = None   # PreprocessTracing when OTEL_* turns tracing on (tracing/)
        if tracer is not None:
            from preprocess.tracing import PreprocessTracing

            self.tracing = PreprocessTracing(tracer, parser)

    @classmethod
    def from_model_config(cls, model_config: dict, pb_utils) -> "PreprocessServing":
        params = model_parameters(model_config)
        check_known_parameters(model_config.get("name", "preprocess"), params, PREPROCESS_PARAMETERS)
        import grammar  # noqa: F401 (xgrammar, for the guide checks: loaded at start-up)

        path = resolve_path(str_param(params, "tokenizer_path", DEFAULT_TOKENIZER))
        ctx = model_context_length(path)
        limits = RequestLimits.from_parameters(params, **({"max_model_len": ctx} if ctx else {}))
        parser = RequestParser(load_tokenizer(path), limits)
        names = [i["name"] for i in model_config.get("input", [])]
        from tracing import ModelTracer

        return cls(parser, pb_utils, names, tracer=ModelTracer.from_env(model_config.get("name", "preprocess")))

    def read_inputs(self, request) -> dict[str, Any]:
        inputs = {}
        for name in self.input_names:
            t = self.pb.get_input_tensor_by_name(request, name)
            if t is not None:
                inputs[name] = t.as_numpy()
        return inputs

    def _process(self, request):
        pb = self.pb
        try:
            inputs = self.read_inputs(request)
            stop = inputs.pop(wire.STOP, None)
            if stop is not None and np.asarray(stop).dtype.kind == "b" and bool(np.asarray(stop).any()):
                return self._response([], "", stop=True)
            check_no_parameters(request.parameters())
            check_batch_of_one(inputs)
            text = inputs.get("text_input")
            if "messages" in inputs and text is not None and _is_empty_text(text):
                del inputs["text_input"]
            pre = self.parser.parse(inputs)
            req = wire.LLMRequest(sampling=pre.sampling_params, stream=pre.options.stream,
                                  options=pre.options_json(), request_id=request.request_id() or "")
            return self._response(list(pre.prompt_token_ids), req.to_json(), stop=False)
        except RequestError as e:
            return pb.InferenceResponse(error=pb.TritonError(str(e)))
        except Exception as e:  # a bug must answer this request, not kill the batch
            log.exception("preprocess failed")
            return pb.InferenceResponse(error=pb.TritonError(f"preprocess: internal error: {type(e).__name__}: {e}"))

    def _response(self, ids: list[int], request_json: str, stop: bool):
        pb = self.pb
        return pb.InferenceResponse(output_tensors=[
            pb.Tensor(wire.INPUT_IDS, np.asarray(ids, dtype=np.int32).reshape(1, -1)),
            pb.Tensor(wire.REQUEST, np.asarray([[request_json.encode()]], dtype=np.object_)),
            pb.Tensor(wire.STOP, np.asarray([[stop]], dtype=np.bool_)),
        ])


def check_no_parameters(parameters_json: str) -> None:
    """Refuse request parameters, naming them: the ensemble takes none, and Triton's HTTP ``generate``
    and ``generate_stream`` pass every JSON key that is not an input (a misspelt one too) as one,
    which would otherwise be ignored without a word."""
    names = sorted(json.loads(parameters_json or "{}"))
    if not names:
        return
    hints = [f"{n} (an input: send it as a tensor)" if n in KNOWN_INPUTS else
             f"{n} (did you mean {close[0]}?)" if (close := difflib.get_close_matches(n, KNOWN_INPUTS, 1)) else n
             for n in names]
    several = len(names) > 1
    raise RequestError(names[0], f"unknown field{'s' if several else ''} {', '.join(hints)}: "
                                 f"{'not inputs' if several else 'not an input'} of the ensemble (the inputs: docs/api.md)")


def check_batch_of_one(inputs: dict[str, Any]) -> None:
    """Every input carries the batch dimension (max_batch_size > 0); a request is one prompt."""
    for name, arr in inputs.items():
        shape = np.shape(arr)
        if len(shape) >= 2 and shape[0] != 1:
            raise RequestError(name, f"a request carries one prompt (batch size 1), got batch size {shape[0]}; "
                                     "send one request per prompt (num_return_sequences for several samples)")


def model_context_length(folder: Path) -> int | None:
    """``max_position_embeddings`` of the checkpoint's config.json beside the tokenizer, if any."""
    try:
        return int(json.loads((folder / "config.json").read_text())["max_position_embeddings"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _is_empty_text(arr) -> bool:
    flat = np.asarray(arr).reshape(-1)
    return flat.size == 0 or (flat.size == 1 and flat[0] in (b"", ""))
