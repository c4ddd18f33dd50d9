"""Text through the whole pipeline (preprocess -> llm -> postprocess) over gRPC streaming."""
from __future__ import annotations

import json

import pytest

from backend.engine.llm_engine import output_token_ids
from contracts.sampling_params import SamplingParams
from tests.e2e.helpers import Stream, kv_used, run, wait_until
from cli.client import build_inputs

PROMPTS = ["def fibonacci(n):", "import os\nimport sys\n\n", "class Stack:\n    def __init__(self):"]
MAX_TOKENS = 24


def engine_greedy(engine, tokenizer, prompt_ids: list[int], max_tokens: int) -> tuple[str, list[int]]:
    outs, = engine.generate([prompt_ids], SamplingParams(max_tokens=max_tokens, temperature=0.0))
    ids = output_token_ids(outs)
    return tokenizer.decode(ids, skip_special_tokens=True), ids


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_text_equals_the_engine_in_process(server, tokenizer, reference_engine, prompt):
    res = run(server.grpc_url, prompt, MAX_TOKENS, temperature=0.0, exclude_input_in_output=True, stream=False)
    assert res.error is None, res.error
    expected, ids = engine_greedy(reference_engine, tokenizer, tokenizer.encode(prompt), MAX_TOKENS)
    assert res.text == expected
    assert res.num_final == 1 and res.finish_reason in ("length", "stop")
    assert res.num_output_tokens == len(ids)


@pytest.mark.parametrize("exclude_input", [True, False])
def test_streamed_deltas_join_to_the_non_streamed_text(server, exclude_input):
    prompt = PROMPTS[0]
    streamed = run(server.grpc_url, prompt, MAX_TOKENS, temperature=0.0, stream=True,
                   exclude_input_in_output=exclude_input)
    whole = run(server.grpc_url, prompt, MAX_TOKENS, temperature=0.0, stream=False,
                exclude_input_in_output=exclude_input)
    assert streamed.error is None and whole.error is None
    assert len(whole.chunks) == 1 and whole.chunks[0].final
    assert len([c for c in streamed.chunks if c.text]) > 1, "streaming should deliver several deltas"
    assert streamed.text == whole.text
    assert streamed.num_final == 1 and streamed.chunks[-1].final
    assert streamed.finish_reason == whole.finish_reason


def test_exclude_input_in_output_both_ways(server):
    prompt = PROMPTS[1]
    without = run(server.grpc_url, prompt, MAX_TOKENS, temperature=0.0, exclude_input_in_output=True)
    with_prompt = run(server.grpc_url, prompt, MAX_TOKENS, temperature=0.0, exclude_input_in_output=False)
    default = run(server.grpc_url, prompt, MAX_TOKENS, temperature=0.0)  # TensorRT-LLM's default: false
    assert with_prompt.text == prompt + without.text
    assert default.text == with_prompt.text
    assert not without.text.startswith(prompt)


def test_messages_use_the_chat_template(server, tokenizer, reference_engine):
    from preprocess.chat_template import ChatTemplate

    messages = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "Sort a list."}]
    res = run(server.grpc_url, "", MAX_TOKENS, messages=json.dumps(messages), temperature=0.0,
              exclude_input_in_output=True, return_num_input_tokens=True)
    assert res.error is None, res.error
    rendered = ChatTemplate(tokenizer.chat_template, tokenizer.template_variables()).render(messages)
    assert "<|user|>" in rendered and rendered.rstrip().endswith("<|assistant|>")
    prompt_ids = tokenizer.encode(rendered, add_special_tokens=False)
    expected, _ = engine_greedy(reference_engine, tokenizer, prompt_ids, MAX_TOKENS)
    assert res.text == expected
    assert max(c.num_input_tokens for c in res.chunks) == len(prompt_ids)


def _token_spans(tokenizer, ids: list[int]) -> list[tuple[int, int]]:
    """Character span of each output token in the decoded text (incremental decode)."""
    spans, prev = [], 0
    for i in range(1, len(ids) + 1):
        end = len(tokenizer.decode(ids[:i]))
        spans.append((prev, end))
        prev = end
    return spans


def _stop_candidates(text: str, spans, kind: str):
    """Stop strings whose FIRST occurrence in ``text`` ends inside a token (mid) or crosses a token
    boundary (span), built from the greedy text itself."""
    boundaries = {e for _, e in spans}
    for a, b in spans:
        if kind == "mid" and b - a >= 2:
            for end in range(a + 1, b):
                stop = text[max(0, end - 3):end]
                first = text.find(stop)
                if stop.strip() and first + len(stop) not in boundaries:
                    yield stop, first
        if kind == "span" and b - a >= 1 and a >= 2:
            stop = text[a - 2:min(b, a + 2)]
            first = text.find(stop)
            if stop.strip() and any(first < x < first + len(stop) for x in boundaries):
                yield stop, first


@pytest.mark.parametrize("kind", ["mid", "span"])
@pytest.mark.parametrize("stream", [True, False])
def test_stop_strings_end_mid_token_and_across_tokens(server, tokenizer, reference_engine, kind, stream):
    prompt = PROMPTS[2]
    max_tokens = 40
    full, ids = engine_greedy(reference_engine, tokenizer, tokenizer.encode(prompt), max_tokens)
    spans = _token_spans(tokenizer, ids)
    candidates = [c for c in _stop_candidates(full, spans, kind) if c[1] > 0]
    assert candidates, f"no {kind} stop string candidate in the greedy text {full!r}"
    stop, first = candidates[len(candidates) // 2]
    res = run(server.grpc_url, prompt, max_tokens, temperature=0.0, exclude_input_in_output=True, stream=stream,
              stop_words=[stop], return_num_output_tokens=True)
    assert res.error is None, res.error
    assert res.text == full[:first], (stop, full)
    assert res.finish_reason == "stop"
    assert res.num_final == 1
    tokens_to_stop = next(i + 1 for i, (_, b) in enumerate(spans) if b >= first + len(stop))
    assert res.num_output_tokens == tokens_to_stop
    included = run(server.grpc_url, prompt, max_tokens, temperature=0.0, exclude_input_in_output=True,
                   stream=stream, stop_words=[stop], include_stop_str_in_output=True)
    assert included.text == full[:first + len(stop)]
    wait_until(lambda: kv_used(server.metrics_url) == 0, 10, "KV blocks freed after the stop")


def test_stop_string_stops_the_engine_early(server):
    """A stop string in the stream aborts the sequence in the engine (BLS stop), long before max_tokens."""
    prompt = "def add(a, b):\n    return a + b\n\n\ndef"
    probe = run(server.grpc_url, prompt, 8, temperature=0.0, exclude_input_in_output=True)
    stop = probe.text[2:4] if len(probe.text) >= 4 else probe.text[:1]
    assert stop.strip(), f"degenerate greedy text {probe.text!r}"
    res = run(server.grpc_url, prompt, 400, min_tokens=400, temperature=0.0, exclude_input_in_output=True,
              stream=True, stop_words=[stop], return_num_output_tokens=True)
    assert res.finish_reason == "stop" and res.num_output_tokens <= 8
    # Tokens generated after the match (before the engine saw the stop) come back as empty deltas.
    assert len(res.chunks) < 50
    wait_until(lambda: kv_used(server.metrics_url) == 0, 10, "KV blocks freed after the stop string")


def test_logprobs_and_token_counts(server, tokenizer):
    prompt = PROMPTS[0]
    for stream in (False, True):
        res = run(server.grpc_url, prompt, 8, temperature=0.0, stream=stream, exclude_input_in_output=True,
                  return_log_probs=True, return_num_input_tokens=True, return_num_output_tokens=True)
        assert res.error is None, res.error
        lps = [x for c in res.chunks for x in c.log_probs]
        assert len(lps) == res.num_output_tokens > 0
        assert all(x <= 0.0 for x in lps)
        assert res.chunks[-1].cum_log_prob == pytest.approx(sum(lps), abs=1e-3)
        assert max(c.num_input_tokens for c in res.chunks) == len(tokenizer.encode(prompt))


def test_num_return_sequences(server):
    with Stream(server.grpc_url) as s:
        rid = s.send(build_inputs(PROMPTS[0], 6, num_return_sequences=2, temperature=1.0, seed=7, stream=False,
                                  exclude_input_in_output=True))
        res = s.wait([rid])[rid]
    assert res.error is None, res.error
    data = [c for c in res.chunks if c.text or c.finish_reason]
    assert sorted(c.sequence_index for c in data) == [0, 1]
    assert res.num_final == 1
