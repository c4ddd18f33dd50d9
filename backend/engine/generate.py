"""``generate``: submit prompts to an engine and wait for every output (tests, benchmarks, scripts)."""
from __future__ import annotations

import threading
from typing import Callable, Protocol, Sequence

from backend.core.outputs import RequestOutput
from contracts.sampling_params import SamplingParams


class Engine(Protocol):
    """What ``generate`` needs of ``LLMEngine``."""

    def add_request(self, request_id: str, prompt_token_ids: Sequence[int], params: SamplingParams,
                    on_output: Callable[[RequestOutput], None]) -> None: ...

    def run_inline(self) -> None: ...


def generate(engine: Engine, prompts: Sequence[Sequence[int]],
             params: SamplingParams | Sequence[SamplingParams], timeout: float = 600.0) -> list[list[RequestOutput]]:
    """Submit every prompt, wait for all, return each request's outputs in order. Without a loop thread
    (``start()`` not called) the engine steps on the caller's thread."""
    plist = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
    results: list[list[RequestOutput]] = [[] for _ in prompts]
    done = threading.Semaphore(0)

    def collect(i):
        def cb(out):
            results[i].append(out)
            if out.request_finished:
                done.release()
        return cb

    base = f"gen-{id(results)}"
    for i, (p, sp) in enumerate(zip(prompts, plist)):
        engine.add_request(f"{base}-{i}", p, sp, collect(i))
    engine.run_inline()
    for _ in prompts:
        if not done.acquire(timeout=timeout):
            raise TimeoutError("generate timed out")
    return results


def output_token_ids(outputs: list[RequestOutput], seq_index: int = 0) -> list[int]:
    """All tokens of one sequence, concatenated from its streamed outputs."""
    return [t for o in outputs if o.seq_index == seq_index for t in o.new_token_ids]
