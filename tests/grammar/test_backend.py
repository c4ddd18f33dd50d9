"""The xgrammar backend: tokenizer view, compile cache, matchers, and outputs the grammars admit."""
from __future__ import annotations

import json
import random
import subprocess
import sys
import zlib

import pytest
import torch

from grammar import GuideError, XGrammarBackend, check_output, tokenizer_info_from_folder
from tests.helpers.checkpoints import DEMO_TARGET, REPO
from tests.helpers.grammar_walk import allowed_token_ids, decode, random_walk
from bench.harness.guides import all_guides

EOS = 1


def test_tokenizer_view_equals_hf_except_the_blanked_special_tokens():
    import xgrammar as xgr
    from transformers import AutoTokenizer

    ours, _ = tokenizer_info_from_folder(DEMO_TARGET, 4096, [EOS])
    hf = xgr.TokenizerInfo.from_huggingface(AutoTokenizer.from_pretrained(str(DEMO_TARGET)), vocab_size=4096,
                                            stop_token_ids=[EOS])
    assert (ours.vocab_type, ours.add_prefix_space, ours.stop_token_ids) == (hf.vocab_type, hf.add_prefix_space, [EOS])
    special = {0, 2, 3, 4, 5, 6}           # <|bos|> <|pad|> and the chat markers
    assert set(ours.special_token_ids) == special
    a, b = ours.decoded_vocab, hf.decoded_vocab
    assert [i for i in range(4096) if a[i] != b[i]] == sorted(special | {EOS})


def test_tokenizer_identity_changes_with_vocab_size_and_stops():
    ids = {tokenizer_info_from_folder(DEMO_TARGET, v, s)[1] for v, s in ((4096, [1]), (4096, [1, 6]), (4128, [1]))}
    assert len(ids) == 3
    again = tokenizer_info_from_folder(DEMO_TARGET, 4096, [1])[1]
    assert again == tokenizer_info_from_folder(DEMO_TARGET, 4096, [1])[1]


def test_cache_is_keyed_by_type_text_and_tokenizer(xgr_backend):
    b = XGrammarBackend(xgr_backend.tokenizer_info, "tok-a")
    c1 = b.compile("regex", "[0-9]+")
    assert b.compile("regex", "[0-9]+") is c1
    assert b.cache_stats().hits == 1 and b.cache_stats().misses == 1
    assert b.compile("ebnf_grammar", 'root ::= [0-9]+') is not c1          # same language, other type
    assert c1.key == ("regex", "[0-9]+", "tok-a")
    other = XGrammarBackend(xgr_backend.tokenizer_info, "tok-b")
    assert other.compile("regex", "[0-9]+").key[2] == "tok-b"
    assert b.compile("json", "ignored").key == b.compile("json", "").key    # json takes no guide text


def test_cache_is_bounded_by_memory(xgr_backend):
    b = XGrammarBackend(xgr_backend.tokenizer_info, "t", cache_bytes=1)
    b.compile("regex", "a+")
    b.compile("regex", "b+")
    assert b.cache_stats().entries == 1 and b.cached("regex", "a+") is None and b.cached("regex", "b+") is not None


def test_compile_errors_name_the_field(xgr_backend):
    with pytest.raises(GuideError) as err:
        xgr_backend.compile("ebnf_grammar", "root ::= (")
    assert err.value.field == "guided_decoding_guide" and "EBNF" in str(err.value)


def test_matcher_accept_validate_rollback_and_eos_only_at_the_end(xgr_backend):
    c = xgr_backend.compile("regex", "ab")
    vocab = xgr_backend.tokenizer_info.decoded_vocab
    tok = {v: i for i, v in enumerate(vocab) if v in (b"a", b"b", b"x")}
    m = xgr_backend.matcher(c)
    bitmask = xgr_backend.allocate_bitmask(2)
    m.fill_bitmask(bitmask, 0)
    assert EOS not in allowed_token_ids(bitmask[0], 4096)
    assert m.validate_tokens([tok[b"a"], tok[b"x"]]) == 1            # state unchanged afterwards
    assert not m.accept_tokens([tok[b"a"], tok[b"x"]])               # nothing taken
    assert m.accept_tokens([tok[b"a"], tok[b"b"]])
    m.fill_bitmask(bitmask, 1)
    assert allowed_token_ids(bitmask[1], 4096) == [EOS]              # EOS where the grammar may end, only
    m.rollback(1)
    m.fill_bitmask(bitmask, 1)
    assert allowed_token_ids(bitmask[1], 4096) == [tok[b"b"]]
    assert m.accept_tokens([tok[b"b"], EOS]) and m.is_terminated()


@pytest.mark.parametrize("stops", [[EOS], [EOS, 6]])
def test_termination_kept_in_python_agrees_with_xgrammar(xgr_backend, stops):
    """``XGrammarMatcher.is_terminated`` answers without asking xgrammar: random walks of accepts (admitted
    tokens, EOS where admitted, tokens the grammar rejects, tokens after the end) and rollbacks, over every
    test guide, compare it with xgrammar's own answer after each call."""
    b = XGrammarBackend(*tokenizer_info_from_folder(DEMO_TARGET, 4096, stops))
    bitmask = b.allocate_bitmask(1)
    rng = random.Random(len(stops))
    ends = 0
    for name, kind, text in all_guides()[::3]:
        m = b.matcher(b.compile(kind, text))
        depth = 0
        for _ in range(60):
            action = rng.random()
            if action < 0.15 and depth:
                n = rng.randint(1, depth)
                m.rollback(n)
                depth -= n
            elif action < 0.25:
                depth += m.accept_tokens([rng.randrange(4096)])          # mostly rejected, nothing taken
            elif m.is_terminated():
                assert not m.accept_tokens([stops[-1]])
            else:
                m.fill_bitmask(bitmask, 0)
                allowed = allowed_token_ids(bitmask[0], 4096)
                ending = [t for t in allowed if t in stops]
                t = rng.choice(ending) if ending and rng.random() < 0.5 else rng.choice(allowed)
                assert m.accept_tokens([t])
                depth += 1
            assert m.is_terminated() == m._m.is_terminated(), (name, depth)
            ends += m.is_terminated()
    assert ends >= 5


def test_fills_overwrite_whole_rows(xgr_backend):
    """The engine reuses its bitmask buffer without resetting rows a fill writes: a fill (single or batched)
    must write every word of its row, whatever the row held."""
    c = xgr_backend.compile("regex", "ab")
    matchers = [xgr_backend.matcher(c) for _ in range(3)]
    a = xgr_backend.tokenizer_info.decoded_vocab.index(b"a")
    assert matchers[1].accept_tokens([a])
    for rows in ([0, 1, 2], [1]):
        masks = []
        for garbage in (0, -1, 0x5A5A5A5A):
            bitmask = torch.full((3, 128), garbage, dtype=torch.int32)
            xgr_backend.fill_bitmasks([matchers[r] for r in rows], bitmask, rows)
            masks.append(bitmask[rows])
        assert all(torch.equal(masks[0], m) for m in masks[1:])


def test_jump_forward_tokens_spell_the_forced_text(xgr_backend):
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"],
              "additionalProperties": False}
    m = xgr_backend.matcher(xgr_backend.compile("json_schema", json.dumps(schema)))
    forced = m.jump_forward_tokens()
    assert forced and decode(xgr_backend, forced).startswith('{"answer')
    assert m.accept_tokens(forced)


@pytest.mark.parametrize("name, kind, text", all_guides(), ids=[g[0] for g in all_guides()])
def test_every_output_the_grammar_admits_passes_the_output_check(xgr_backend, name, kind, text):
    """Random walks over the real vocabulary (no model): whatever terminates satisfies the guide."""
    compiled = xgr_backend.compile(kind, text)
    rng = random.Random(zlib.crc32(name.encode()))
    finished = 0
    for _ in range(25):
        tokens, terminated = random_walk(xgr_backend, compiled, rng, {EOS})
        if terminated:
            finished += 1
            out = decode(xgr_backend, tokens)
            assert check_output(kind, text, out) is None, (out, check_output(kind, text, out))
    assert finished >= 3


def test_length_bounded_strings_stay_valid_under_high_byte_pressure(xgr_backend):
    """The repaired string class: random walks that favour lone high bytes (UTF-8 lead/continuation
    tokens) never produce control characters, surrogates or overlong sequences in a bounded string."""
    vocab = xgr_backend.tokenizer_info.decoded_vocab
    high = {i for i, v in enumerate(vocab) if v and v[0] >= 0x80}
    schema = json.dumps({"type": "object", "properties": {"s": {"type": "string", "minLength": 1, "maxLength": 5},
                                                          "t": {"type": "string"}}, "required": ["s", "t"]})
    c = xgr_backend.compile("json_schema", schema)
    rng = random.Random(7)
    bitmask = xgr_backend.allocate_bitmask(1)
    finished = 0
    for _ in range(150):
        m, out = xgr_backend.matcher(c), []
        for _ in range(80):
            m.fill_bitmask(bitmask, 0)
            allowed = allowed_token_ids(bitmask[0], 4096)
            hi = [t for t in allowed if t in high]
            others = [a for a in allowed if a != EOS]
            if EOS in allowed and (not others or rng.random() < 0.3):
                t = EOS
            else:
                t = rng.choice(hi) if hi and rng.random() < 0.7 else rng.choice(others)
            assert m.accept_tokens([t])
            if m.is_terminated():
                break
            out.append(t)
        if m.is_terminated():
            finished += 1
            raw = b"".join(vocab[t] for t in out)
            assert check_output("json_schema", schema, raw.decode("utf-8")) is None, raw
    assert finished >= 15


def test_bitmask_is_cpu_int32_all_allowed():
    from grammar.backend import XGrammarBackend as B  # noqa: F401 (import path used by the builder)

    b = XGrammarBackend.from_folder(DEMO_TARGET, 4096, [EOS])
    m = b.allocate_bitmask(3)
    assert m.dtype == torch.int32 and m.shape == (3, 128) and bool((m == -1).all())


def test_import_loads_no_other_project_package():
    """The grammar layer is a leaf: importing it pulls in no other project package (contracts aside)."""
    code = ("import sys, grammar\n"
            "mods = sorted(m for m in sys.modules if m.split('.')[0] in "
            "('postprocess', 'preprocess', 'backend', 'gateway', 'cli', 'tools', 'bench', 'tracing', "
            "'triton_python_backend_utils'))\n"
            "print(','.join(mods))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert out.strip() == ""
