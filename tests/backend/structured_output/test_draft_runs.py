"""The matcher over speculative runs: valid prefixes (ending where jump-forward would force), and
accepting a verified run (up to the grammar's end; dropping the token sampled at a forced state)."""
from __future__ import annotations

import pytest

from backend.structured_output.draft_runs import RunResult, accept_run, forced_here, valid_prefix
from tests.helpers.checkpoints import DEMO_TARGET

EOS = 1


@pytest.fixture(scope="module")
def backend():
    from grammar import XGrammarBackend

    return XGrammarBackend.from_folder(DEMO_TARGET, 4096, [EOS])


@pytest.fixture(scope="module")
def tok(backend):
    vocab = backend.tokenizer_info.decoded_vocab
    return {v.decode(): i for i, v in enumerate(vocab) if v in (b"q", b"7", b"z", b"x", b"(", b"[")}


def test_valid_prefix_stops_at_the_first_invalid_token_and_after_the_end(backend, tok):
    m = backend.matcher(backend.compile("regex", "q7z"))
    q, s, z, x = tok["q"], tok["7"], tok["z"], tok["x"]
    assert valid_prefix(m, [q, s, x, z], stop_where_forced=False) == 2
    assert valid_prefix(m, [q, s, z, EOS, x], stop_where_forced=False) == 4
    assert valid_prefix(m, [x], stop_where_forced=False) == 0
    assert m.accept_tokens([q])                                   # the state was left where it was


def test_valid_prefix_with_jump_forward_ends_where_the_grammar_forces(backend, tok):
    m = backend.matcher(backend.compile("regex", r"(\(q7z|\[x)"))   # after "(" the rest is forced
    assert not forced_here(m)
    assert valid_prefix(m, [tok["("], tok["q"], tok["7"]], stop_where_forced=True) == 1
    assert valid_prefix(m, [tok["("], tok["q"], tok["7"]], stop_where_forced=False) == 3


def test_accept_run(backend, tok):
    q, s, z, x = tok["q"], tok["7"], tok["z"], tok["x"]
    compiled = backend.compile("regex", "q7z")
    m = backend.matcher(compiled)
    assert accept_run(m, [q, s, z, EOS, x], drop_where_forced=False) is RunResult.ACCEPTED   # x after the end
    assert m.is_terminated()
    m = backend.matcher(compiled)
    assert accept_run(m, [q, x], drop_where_forced=False) is RunResult.REJECTED
    assert accept_run(m, [q], drop_where_forced=False) is RunResult.ACCEPTED                 # unchanged before
    m = backend.matcher(backend.compile("regex", r"(\(q7z|\[x)"))
    assert accept_run(m, [tok["("], tok["q"]], drop_where_forced=True) is RunResult.LAST_DROPPED
    assert forced_here(m) and m.accept_tokens([tok["q"]])         # the matcher stopped after "("
