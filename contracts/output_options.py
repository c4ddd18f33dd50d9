"""The output options that travel preprocess -> llm -> postprocess as one JSON string.

An ensemble step cannot read tensors from both preprocess and a decoupled model, so preprocess
serialises what postprocess needs, the engine forwards it untouched with the first response of
each request, and postprocess parses it once per request. The format is documented in docs/api.md.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields

OPTIONS_VERSION = 1


@dataclass(frozen=True)
class OutputOptions:
    """How postprocess turns a request's token stream into text.

    ``prompt_token_ids``: the whole prompt when ``exclude_input_in_output`` is false (its text
    prefixes the first delta); otherwise only the prompt's last few tokens, which seed the
    detokenizer so the first output token's leading space decodes right.
    """

    stop: tuple[str, ...] = ()
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    exclude_input_in_output: bool = False
    stream: bool = False
    return_log_probs: bool = False
    return_num_input_tokens: bool = False
    return_num_output_tokens: bool = False
    return_perf_metrics: bool = False       # speculative decoding counts (TensorRT-LLM's perf-metric outputs)
    n: int = 1
    num_input_tokens: int = 0
    prompt_token_ids: tuple[int, ...] = ()
    guide_type: str | None = None
    guide: str = ""          # the schema, pattern or grammar: postprocess checks finished outputs against it

    def __post_init__(self) -> None:
        if not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError("stop: every stop string must be a non-empty string")
        for name in ("include_stop_str_in_output", "skip_special_tokens", "exclude_input_in_output", "stream",
                     "return_log_probs", "return_num_input_tokens", "return_num_output_tokens",
                     "return_perf_metrics"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}: expected true or false, got {getattr(self, name)!r}")
        for name, lo in (("n", 1), ("num_input_tokens", 0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ValueError(f"{name}: expected an integer >= {lo}, got {v!r}")
        if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in self.prompt_token_ids):
            raise ValueError("prompt_token_ids: expected non-negative integers")
        if self.guide_type is not None and not isinstance(self.guide_type, str):
            raise ValueError(f"guide_type: expected a string or null, got {self.guide_type!r}")
        if not isinstance(self.guide, str):
            raise ValueError(f"guide: expected a string, got {self.guide!r}")

    def to_json(self) -> str:
        """Compact JSON: ``{"v": 1, "stop": [...], ...}`` (every field, lists for tuples)."""
        d = asdict(self)
        d["stop"] = list(self.stop)
        d["prompt_token_ids"] = list(self.prompt_token_ids)
        return json.dumps({"v": OPTIONS_VERSION, **d}, ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> OutputOptions:
        """Parse ``to_json``'s output. Missing keys take defaults, unknown keys are ignored;
        a wrong version or a wrong type raises ``ValueError``."""
        if isinstance(text, (bytes, bytearray)):
            text = bytes(text).decode("utf-8")
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"output options: not JSON ({e})") from e
        if not isinstance(d, dict):
            raise ValueError("output options: expected a JSON object")
        if d.get("v", OPTIONS_VERSION) != OPTIONS_VERSION:
            raise ValueError(f"output options: unsupported version {d.get('v')!r} (expected {OPTIONS_VERSION})")
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in d.items() if k in known}
        for name in ("stop", "prompt_token_ids"):
            if name in kwargs:
                if not isinstance(kwargs[name], list):
                    raise ValueError(f"{name}: expected a list")
                kwargs[name] = tuple(kwargs[name])
        return cls(**kwargs)
