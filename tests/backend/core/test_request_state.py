"""Stop rules: an accepted run is appended at once (``run_continues``) only where appending it token by token would
not have stopped the sequence (``stop_reason`` after each token), and that is the common case."""
from __future__ import annotations

import numpy as np

from backend.core.request_state import run_continues, stop_reason
from backend.core.sequence import Sequence
from contracts.sampling_params import SamplingParams


def continues_token_by_token(seq: Sequence, tokens: list[int], eos: frozenset[int], max_model_len: int) -> bool:
    """The reference: append each token and ask ``stop_reason``; the sequence is left as it was."""
    n = len(seq.output_token_ids)
    try:
        for t in tokens:
            seq.output_token_ids.append(t)
            if stop_reason(seq, t, eos, max_model_len) is not None:
                return False
        return True
    finally:
        del seq.output_token_ids[n:]


def test_run_continues_agrees_with_stop_reason_token_by_token():
    rng = np.random.default_rng(0)
    seen = {True: 0, False: 0}
    for i in range(3000):
        max_tokens = int(rng.integers(1, 12))
        params = SamplingParams(max_tokens=max_tokens, min_tokens=min(max_tokens, int(rng.integers(0, 4))),
                                ignore_eos=bool(rng.random() < 0.3),
                                stop_token_ids=tuple(int(t) for t in rng.choice(8, size=int(rng.integers(0, 3)),
                                                                                replace=False)))
        seq = Sequence(seq_id=i, request_id="r", seq_index=0, prompt_token_ids=[9] * int(rng.integers(1, 6)),
                       params=params)
        seq.output_token_ids = rng.integers(3, 12, size=int(rng.integers(0, params.max_tokens))).tolist()
        tokens = rng.integers(0, 12, size=int(rng.integers(1, 6))).tolist()
        eos = frozenset({1})
        max_model_len = int(rng.integers(4, 20))
        if seq.num_tokens >= max_model_len:
            continue
        got = run_continues(seq, tokens, eos, max_model_len)
        want = continues_token_by_token(seq, tokens, eos, max_model_len)
        assert want or not got, (params, seq.output_token_ids, tokens, max_model_len)   # never past a stop
        if got != want:                      # conservative only where a stop token is held back by min_tokens
            assert set(tokens) & ((set() if params.ignore_eos else eos) | set(params.stop_token_ids))
        seen[got] += 1
    assert min(seen.values()) > 300          # both answers, many times
