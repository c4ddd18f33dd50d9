"""Constrained decoding in the engine: valid by construction, HF + xgrammar oracle, mixed batches,
preemption and prefix hits, compile cache, time limit and failures, and every block free afterwards."""
from __future__ import annotations

import json
import random
import threading
import time

import pytest
import torch

from backend.config import EngineConfig
from backend.core.outputs import FinishReason
from backend.engine.llm_engine import LLMEngine, output_token_ids
from contracts.sampling_params import GuideSpec, SamplingParams
from grammar import check_output
from tests.backend.engine.test_engine_api import collect
from bench.harness.guides import GRAMMARS, REGEXES, SCHEMAS, all_guides

PROMPTS = ["# a record as JSON\nrecord = ", "def parse(text):\n    return ", "x = ", "import json\n\ndata = "]


@pytest.fixture(scope="module")
def tokenizer(demo_target):
    from preprocess.tokenizer import load_tokenizer

    return load_tokenizer(demo_target)


@pytest.fixture(scope="module")
def engine(demo_target):
    eng = LLMEngine(EngineConfig.from_settings(model_path=str(demo_target), kv_cache_bytes=32 << 20, device="cpu",
                                               max_num_seqs=64)).start()
    yield eng
    eng.shutdown()


def encode(tokenizer, i: int) -> list[int]:
    return tokenizer.encode(PROMPTS[i % len(PROMPTS)], add_special_tokens=True)


def run_one(engine, rid, prompt, params, timeout=120.0):
    outs, done = collect(engine, rid, prompt, params)
    assert done.wait(timeout), f"{rid} never finished"
    return outs


def test_sampled_outputs_are_valid_by_construction(engine, tokenizer):
    """The issue's check: >= 50 sampled requests (temperature 1, top-p 1) over the shared guides
    (10 JSON schemas, 4 regexes, 2 EBNF grammars, json): every output that finishes ``stop`` satisfies
    its guide; the others were cut by max_tokens and say ``length``."""
    guides = all_guides()
    jobs = [(name, kind, text, seed) for seed in range(3) for name, kind, text in guides]
    assert len(jobs) >= 50 and len(SCHEMAS) >= 8
    prompts = [encode(tokenizer, i) for i in range(len(jobs))]
    params = [SamplingParams(max_tokens=96, temperature=1.0, top_p=1.0, seed=1000 + i, guide=GuideSpec(k, t))
              for i, (_, k, t, _) in enumerate(jobs)]
    results = engine.generate(prompts, params)
    stops = 0
    for (name, kind, text, seed), outs in zip(jobs, results):
        ids = output_token_ids(outs)
        reason = outs[-1].finish_reason
        assert outs[-1].error is None, (name, outs[-1].error)
        if reason is FinishReason.STOP:
            stops += 1
            assert ids[-1] == 1                                   # EOS, taken where the grammar may end
            out = tokenizer.decode(ids, skip_special_tokens=True)
            assert check_output(kind, text, out) is None, (name, seed, out, check_output(kind, text, out))
        else:
            assert reason is FinishReason.LENGTH and len(ids) == 96, (name, reason)
    assert stops >= 0.7 * len(jobs), f"only {stops} of {len(jobs)} finished"
    assert engine.stats().kv_blocks_used == 0


ORACLE_GUIDES = [("json_schema", json.dumps(SCHEMAS[n])) for n in ("nested_object", "enums", "integer_bounds",
                                                                      "string_lengths", "list_of_records")] + \
    [("regex", REGEXES["date"]), ("regex", REGEXES["number_with_unit"]), ("ebnf_grammar", GRAMMARS["key_value_config"]),
     ("json", "")]


@pytest.fixture(scope="module")
def hf_oracle(demo_target, tokenizer):
    """Greedy constrained outputs of HF transformers' generate with xgrammar's HF logits processor,
    compiled by xgrammar alone (its HF tokenizer view, its own JSON-schema compile): independent of
    our grammar layer's tokenizer view, EBNF route and string repairs."""
    import xgrammar as xgr
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf = AutoModelForCausalLM.from_pretrained(str(demo_target), dtype=torch.float32).eval()
    info = xgr.TokenizerInfo.from_huggingface(AutoTokenizer.from_pretrained(str(demo_target)), vocab_size=4096,
                                              stop_token_ids=[1])
    compiler = xgr.GrammarCompiler(info)
    compile_stock = {"json": lambda _: compiler.compile_json_schema("{}", any_whitespace=False),
                     "json_schema": lambda t: compiler.compile_json_schema(t, any_whitespace=False),
                     "regex": compiler.compile_regex, "ebnf_grammar": compiler.compile_grammar}
    expected = []
    for i, (kind, text) in enumerate(ORACLE_GUIDES):
        prompt = encode(tokenizer, i)
        processor = xgr.contrib.hf.LogitsProcessor(compile_stock[kind](text))
        with torch.no_grad():
            out = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                              do_sample=False, max_new_tokens=48, logits_processor=[processor], pad_token_id=2,
                              eos_token_id=1)
        expected.append((prompt, out[0, len(prompt):].tolist()))
    return expected


def greedy_params(kind, text, max_tokens=48):
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, guide=GuideSpec(kind, text))


def test_greedy_equals_hf_generate_with_xgrammar_logits_processor(engine, hf_oracle):
    """Token for token, all requests batched together (one bitmask row each)."""
    prompts = [p for p, _ in hf_oracle]
    results = engine.generate(prompts, [greedy_params(k, t) for k, t in ORACLE_GUIDES])
    for (kind, text), (_, expected), outs in zip(ORACLE_GUIDES, hf_oracle, results):
        assert output_token_ids(outs) == expected, (kind, text[:40])
    assert any(e[-1] == 1 for _, e in hf_oracle), "some oracle output should end with EOS"


def test_mixed_guided_and_unguided_batch(engine, tokenizer, hf_oracle):
    """Guided rows get their masks, unguided rows none: each output equals the one it gets alone."""
    unguided = [encode(tokenizer, i) + [7 + i] for i in range(4)]
    plain = SamplingParams(max_tokens=24, temperature=0.0)
    alone = [output_token_ids(o) for o in engine.generate(unguided, plain)]
    prompts, params = [], []
    for i, ((kind, text), (prompt, _)) in enumerate(zip(ORACLE_GUIDES, hf_oracle)):
        prompts += [prompt, unguided[i % 4]]
        params += [greedy_params(kind, text), plain]
    results = engine.generate(prompts, params)
    for i in range(len(ORACLE_GUIDES)):
        assert output_token_ids(results[2 * i]) == hf_oracle[i][1]
        assert output_token_ids(results[2 * i + 1]) == alone[i % 4]


def test_preemption_and_prefix_hits_keep_guided_output_exact(demo_target, tokenizer, hf_oracle):
    """A tiny KV pool preempts guided sequences (recompute keeps the matcher where it is), a shared
    prompt stem hits the prefix cache; outputs equal the oracle and every block is free after."""
    eng = LLMEngine(EngineConfig.from_settings(model_path=str(demo_target), num_kv_blocks=16, block_size=16,
                                               watermark=0.0,
                                               max_model_len=256, device="cpu", max_num_seqs=16)).start()
    try:
        stem = tokenizer.encode("# configuration records, one per line, as JSON objects\n", add_special_tokens=True)
        jobs = list(zip(ORACLE_GUIDES, hf_oracle)) * 2
        prompts = [stem + p[1:] for _, (p, _) in jobs]               # shared stem: prefix-cache hits
        outs = eng.generate(prompts, [greedy_params(k, t) for (k, t), _ in jobs])
        by_guide: dict = {}
        for ((kind, text), _), o in zip(jobs, outs):
            ids = output_token_ids(o)
            by_guide.setdefault((kind, text), []).append(ids)
            reason = o[-1].finish_reason
            if reason is FinishReason.STOP:
                assert check_output(kind, text, tokenizer.decode(ids, skip_special_tokens=True)) is None
        assert all(a == b for a, b in by_guide.values())             # the same prompt and guide, the same output
        s = eng.stats()
        assert s.num_preemptions > 0 and s.prefix_cache_hits > 0
        assert s.kv_blocks_used == 0
        # the stem changed the prompts, so compare with the engine's own unpressured run
        ref = LLMEngine(EngineConfig.from_settings(model_path=str(demo_target), kv_cache_bytes=32 << 20, device="cpu",
                                                   enable_prefix_caching=False))
        ref_outs = ref.generate(prompts[:len(ORACLE_GUIDES)], [greedy_params(k, t) for k, t in ORACLE_GUIDES])
        assert [output_token_ids(o) for o in ref_outs] == [v[0] for v in by_guide.values()]
    finally:
        eng.shutdown()


def test_parallel_samples_each_follow_the_grammar(engine, tokenizer):
    kind, text = "json_schema", json.dumps(SCHEMAS["enums"])
    outs = run_one(engine, "n4", encode(tokenizer, 0),
                   SamplingParams(max_tokens=64, temperature=1.0, seed=3, n=4, guide=GuideSpec(kind, text)))
    seqs = {o.seq_index for o in outs}
    assert seqs == {0, 1, 2, 3}
    for i in seqs:
        finals = [o for o in outs if o.seq_index == i and o.finished]
        assert finals and finals[-1].finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
        if finals[-1].finish_reason is FinishReason.STOP:
            out = tokenizer.decode(output_token_ids(outs, i), skip_special_tokens=True)
            assert check_output(kind, text, out) is None, out


def test_compiled_grammars_are_cached_and_shared(engine, tokenizer):
    so = engine.structured
    text = json.dumps({"type": "object", "properties": {"cache_probe": {"type": "integer"}},
                       "required": ["cache_probe"], "additionalProperties": False})
    before = so.compiles.num_compiles
    engine.generate([encode(tokenizer, i) for i in range(3)], greedy_params("json_schema", text, 8))
    assert so.compiles.num_compiles == before + 1                 # three requests in flight together: one compile
    engine.generate([encode(tokenizer, 0)], greedy_params("json_schema", text, 8))
    assert so.compiles.num_compiles == before + 1                 # later: a cache hit
    assert so.num_requests == 0


def test_a_guide_that_fails_to_compile_fails_its_request_only(engine, tokenizer):
    outs = run_one(engine, "bad-ebnf", encode(tokenizer, 0), greedy_params("ebnf_grammar", "root ::= (", 4))
    assert outs[-1].finish_reason is FinishReason.ERROR and outs[-1].error.startswith("guided_decoding_guide: ")
    ok = run_one(engine, "after-bad-ebnf", encode(tokenizer, 1), SamplingParams(max_tokens=4, temperature=0.0))
    assert ok[-1].finish_reason is FinishReason.LENGTH


def test_a_sampled_token_the_grammar_rejects_fails_the_request(engine, tokenizer):
    """bad_words can ban every token the grammar admits; the request fails, never emits invalid text."""
    a = tokenizer.encode("a", add_special_tokens=False)
    assert len(a) == 1
    outs = run_one(engine, "banned", encode(tokenizer, 0),
                   SamplingParams(max_tokens=4, temperature=0.0, bad_words_ids=(tuple(a),),
                                  guide=GuideSpec("regex", "a")))
    assert outs[-1].finish_reason is FinishReason.ERROR and "rejected" in outs[-1].error
    assert engine.stats().kv_blocks_used == 0


@pytest.mark.parametrize("kwargs, field", [
    (dict(min_tokens=2), "min_tokens"), (dict(stop_token_ids=(5,)), "stop_token_ids"),
    (dict(ignore_eos=True), "ignore_eos"),
])
def test_options_that_would_cut_or_extend_a_guided_output_are_refused(kwargs, field):
    with pytest.raises(ValueError, match=f"^{field}: not supported with guided decoding"):
        SamplingParams(max_tokens=8, guide=GuideSpec("json"), **kwargs)


class SlowBackend:
    """Wraps the real backend; every compile of a guide containing ``slow`` takes ``delay`` seconds."""

    def __init__(self, inner, delay):
        self.inner, self.delay, self.vocab_size = inner, delay, inner.vocab_size

    def cached(self, kind, guide):
        return self.inner.cached(kind, guide)

    def compile(self, kind, guide):
        if "slow" in guide:
            time.sleep(self.delay)
        return self.inner.compile(kind, guide)

    def matcher(self, compiled):
        return self.inner.matcher(compiled)

    def fill_bitmasks(self, matchers, bitmask, rows):
        self.inner.fill_bitmasks(matchers, bitmask, rows)


def test_compile_time_limit_fails_the_request_and_never_stalls_the_loop(demo_target, tokenizer):
    from grammar import XGrammarBackend

    eng = LLMEngine(EngineConfig.from_settings(model_path=str(demo_target), kv_cache_bytes=8 << 20, device="cpu",
                                               guided_compile_timeout_s=0.5, guided_compile_workers=1))
    eng.structured.compiles.backend = SlowBackend(XGrammarBackend.from_folder(demo_target, 4096, [1]), delay=2.0)
    eng.start()
    try:
        results: dict[str, list] = {}
        done = threading.Semaphore(0)

        def submit(rid, params):
            results[rid] = []

            def cb(o):
                results[rid].append(o)
                if o.request_finished:
                    done.release()
            eng.add_request(rid, encode(tokenizer, 0), params, cb)

        t0 = time.monotonic()
        submit("slow", greedy_params("regex", "(slow|fast)", 4))
        submit("queued", greedy_params("regex", "[0-9]+", 4))        # waits behind the stuck compile
        submit("plain", SamplingParams(max_tokens=16, temperature=0.0))
        for _ in range(3):
            assert done.acquire(timeout=30)
        plain_done = results["plain"][-1]
        assert plain_done.finish_reason is FinishReason.LENGTH
        for rid in ("slow", "queued"):
            last = results[rid][-1]
            assert last.finish_reason is FinishReason.ERROR, (rid, last)
            assert last.error == ("guided_decoding_guide: compiling the grammar took longer than "
                                  "guided_compile_timeout_s (0.5 s)")
        assert time.monotonic() - t0 < 1.9                          # failed at the limit, not after the compile
        assert eng.stats().num_waiting == 0 and eng.structured.num_requests == 0
        time.sleep(2.5)                                              # the stuck compile ends and is cached
        ok = run_one(eng, "again", encode(tokenizer, 0), greedy_params("regex", "(slow|fast)", 8))
        assert ok[-1].finish_reason is FinishReason.STOP
        assert tokenizer.decode(output_token_ids(ok), skip_special_tokens=True) in ("slow", "fast")
    finally:
        eng.shutdown()


def test_idle_loop_sleeps_while_grammars_compile(demo_target, tokenizer):
    """With only a compiling request, the loop waits for the compile instead of spinning."""
    from grammar import XGrammarBackend

    eng = LLMEngine(EngineConfig.from_settings(model_path=str(demo_target), kv_cache_bytes=8 << 20, device="cpu"))
    eng.structured.compiles.backend = SlowBackend(XGrammarBackend.from_folder(demo_target, 4096, [1]), delay=0.6)
    plans = []
    schedule = eng.scheduler.schedule
    eng.scheduler.schedule = lambda: plans.append(schedule()) or plans[-1]
    eng.start()
    try:
        outs = run_one(eng, "s", encode(tokenizer, 0), greedy_params("regex", "slow", 8))
        assert outs[-1].finish_reason is FinishReason.STOP
        empty = sum(1 for p in plans if not p.scheduled)
        assert empty <= 3, f"the loop spun while the grammar compiled ({empty} empty plans)"
    finally:
        eng.shutdown()


def test_guided_requests_are_refused_without_a_grammar_layer(demo_target):
    from backend.engine.builder import build_engine_parts

    cfg = EngineConfig.from_settings(model_path=str(demo_target), kv_cache_bytes=8 << 20, device="cpu")
    parts = build_engine_parts(cfg)
    parts.structured_output = None
    eng = LLMEngine(cfg, parts)
    with pytest.raises(ValueError, match="^guided_decoding_guide_type: guided decoding is not available"):
        eng.add_request("g", [0, 5], greedy_params("regex", "a+"), lambda o: None)


def test_unavailable_backend_fails_guided_requests_with_the_reason(demo_target):
    cfg = EngineConfig.from_settings(model_path=str(demo_target), kv_cache_bytes=8 << 20, device="cpu")
    eng = LLMEngine(cfg)

    def broken():
        raise FileNotFoundError("no tokenizer.json")
    eng.structured.compiles._factory = broken
    assert eng.structured.compiles.warm_up() is False
    outs = eng.generate([[0, 5]], greedy_params("regex", "a+"))[0]
    assert outs[-1].finish_reason is FinishReason.ERROR
    assert "guided decoding is unavailable for this model (FileNotFoundError: no tokenizer.json)" in outs[-1].error


def test_random_mix_leaves_no_state_behind(engine, tokenizer):
    """Aborts mid-flight (also during compile) and finished requests: no matcher, no block left."""
    rng = random.Random(5)
    guides = all_guides()
    for i in range(12):
        name, kind, text = guides[rng.randrange(len(guides))]
        engine.add_request(f"mix-{i}", encode(tokenizer, i), SamplingParams(max_tokens=40, temperature=1.0, seed=i,
                                                                          guide=GuideSpec(kind, text)), lambda o: None)
        if i % 3 == 0:
            engine.abort(f"mix-{i}")
    deadline = time.monotonic() + 60
    while (engine.structured.num_requests or engine.stats().kv_blocks_used) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.structured.num_requests == 0 and engine.stats().kv_blocks_used == 0


@pytest.fixture(scope="module")
def jf_engine(demo_target):
    eng = LLMEngine(EngineConfig.from_settings(model_path=str(demo_target), kv_cache_bytes=32 << 20, device="cpu",
                                               guided_jump_forward=True)).start()
    yield eng
    eng.shutdown()


def test_jump_forward_keeps_outputs_valid_and_saves_forward_passes(jf_engine, tokenizer):
    """Forced keys and punctuation are appended without a forward pass each: sampled outputs stay
    valid, and a schema request takes part in fewer forward passes than it has output tokens."""
    plans: list = []
    schedule = jf_engine.scheduler.schedule
    jf_engine.scheduler.schedule = lambda: plans.append(schedule()) or plans[-1]
    try:
        jobs = [(name, kind, text) for name, kind, text in all_guides()] * 2
        results = jf_engine.generate([encode(tokenizer, i) for i in range(len(jobs))],
                                     [SamplingParams(max_tokens=96, temperature=1.0, seed=77 + i, guide=GuideSpec(k, t))
                                      for i, (_, k, t) in enumerate(jobs)])
    finally:
        jf_engine.scheduler.schedule = schedule
    saved = 0
    for (name, kind, text), outs in zip(jobs, results):
        ids = output_token_ids(outs)
        assert outs[-1].error is None
        if outs[-1].finish_reason is FinishReason.STOP:
            out = tokenizer.decode(ids, skip_special_tokens=True)
            assert check_output(kind, text, out) is None, (name, out)
        if kind == "json_schema":
            rid = outs[-1].request_id
            passes = sum(1 for p in plans for s in p.scheduled if s.seq.request_id == rid and s.sample)
            saved += len(ids) - passes
    assert jf_engine.structured.num_forced_tokens > 0 and saved > 0
    assert jf_engine.stats().kv_blocks_used == 0


def test_jump_forward_under_preemption_and_with_logprobs(demo_target, tokenizer):
    eng = LLMEngine(EngineConfig.from_settings(model_path=str(demo_target), num_kv_blocks=16, block_size=16,
                                               watermark=0.0,
                                               max_model_len=256, device="cpu", guided_jump_forward=True)).start()
    try:
        kind, text = "json_schema", json.dumps(SCHEMAS["nested_object"])
        outs = eng.generate([encode(tokenizer, i) for i in range(12)], greedy_params(kind, text, 64))
        for o in outs:
            if o[-1].finish_reason is FinishReason.STOP:
                assert check_output(kind, text, tokenizer.decode(output_token_ids(o), skip_special_tokens=True)) is None
        assert eng.stats().num_preemptions > 0 and eng.stats().kv_blocks_used == 0
        forced = eng.structured.num_forced_tokens
        lp = eng.generate([encode(tokenizer, 0)], SamplingParams(max_tokens=64, temperature=0.0, logprobs=0,
                                                                  guide=GuideSpec(kind, text)))[0]
        assert eng.structured.num_forced_tokens == forced            # logprob requests decode token by token
        assert sum(len(o.logprobs or []) for o in lp) == len(output_token_ids(lp))
    finally:
        eng.shutdown()
