"""The batched sampler: order, greedy, seeds, distributions, logprobs (backend/sampler.py)."""
import math

import pytest
import torch

from backend.core.sequence import Sequence
from backend.sampling.batch import bad_word_bans, build_sampling_batch
from backend.sampling.processing import compute_probs, process_logits
from backend.sampling.sampler import Sampler, SamplerOutput
from contracts.sampling_params import SamplingParams

EOS = 1


def seq(prompt=(5, 6), output=(), seq_id=0, seq_index=0, **params):
    return Sequence(seq_id=seq_id, request_id=f"r{seq_id}", seq_index=seq_index, prompt_token_ids=list(prompt),
                    params=SamplingParams(**params), output_token_ids=list(output))


def chi2_critical(df: int, z: float = 3.719) -> float:
    """Upper chi-square quantile (Wilson-Hilferty); z = 3.719 is p = 1e-4."""
    a = 2.0 / (9.0 * df)
    return df * (1.0 - a + z * math.sqrt(a)) ** 3


def chi2_stat(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    n = counts.sum().item()
    support = probs > 0
    assert counts[~support].sum() == 0, "drew a token of zero probability"
    exp = probs[support] * n
    return float(((counts[support] - exp) ** 2 / exp).sum()), int(support.sum()) - 1


def draw_many(sampler, logits_row, n, **params):
    """n rows of the same logits, each its own unseeded sequence: n independent draws."""
    sp = SamplingParams(**params)
    seqs = [Sequence(seq_id=i, request_id=f"r{i}", seq_index=0, prompt_token_ids=[5], params=sp) for i in range(n)]
    out = sampler.sample(logits_row.repeat(n, 1), seqs)
    return torch.bincount(out.token_ids, minlength=logits_row.shape[0])


LOGITS6 = torch.tensor([1.5, 0.2, -0.3, 1.0, 0.7, -1.2])


@pytest.mark.parametrize("params", [dict(temperature=1.0), dict(temperature=0.6), dict(temperature=1.7, top_k=3),
                                    dict(temperature=0.9, top_p=0.8), dict(temperature=1.0, min_p=0.3),
                                    dict(temperature=1.3, top_k=4, top_p=0.9, min_p=0.1)])
def test_draws_follow_the_processed_distribution(params):
    sampler = Sampler(vocab_size=6, seed=1)
    counts = draw_many(sampler, LOGITS6, 6000, **params)
    batch = build_sampling_batch([seq(**params)], 6)
    probs = compute_probs(LOGITS6[None], batch)[0]
    stat, df = chi2_stat(counts.double(), probs.double())
    assert df >= 1 and stat < chi2_critical(df), (stat, df, counts.tolist(), probs.tolist())


def test_processed_distribution_by_hand():
    """temperature 2, then top-k 4, then top-p 0.65 (over the top-4 renormalised), then min-p 0.7."""
    x = LOGITS6.double() / 2
    top4 = x.topk(4).indices
    p = torch.zeros(6, dtype=torch.double)
    p[top4] = x[top4].softmax(-1)                # [.337, 0, 0, .262, .226, 0] (+ .176 at index 1)
    order = p.argsort(descending=True)
    before = p[order].cumsum(0) - p[order]
    p[order[before >= 0.65]] = 0                 # keeps 3
    p[p < 0.7 * p.max()] = 0                     # drops .226
    p /= p.sum()
    assert (p > 0).nonzero().flatten().tolist() == [0, 3]
    batch = build_sampling_batch([seq(temperature=2.0, top_k=4, top_p=0.65, min_p=0.7)], 6)
    torch.testing.assert_close(compute_probs(LOGITS6[None], batch)[0].double(), p, atol=1e-6, rtol=1e-5)


def test_temperature_comes_before_top_p():
    # at T = 2 the top-4 masses are [.337, .262, .226, .176]: top-p 0.65 keeps three tokens;
    # at T = 1 they would be [.430, .261, .193, .117] and keep only two.
    batch = build_sampling_batch([seq(temperature=2.0, top_k=4, top_p=0.65)], 6)
    kept = (process_logits(LOGITS6[None], batch)[0] > float("-inf")).nonzero().flatten().tolist()
    assert kept == [0, 3, 4]


def test_penalties_come_before_temperature():
    # frequency penalty then temperature: (x - f * count) / T, not x / T - f * count
    s = seq(output=[0, 0], temperature=2.0, frequency_penalty=1.0)
    got = process_logits(LOGITS6[None], build_sampling_batch([s], 6))[0]
    want = LOGITS6.clone()
    want[0] -= 2.0
    torch.testing.assert_close(got, want / 2)


def test_greedy_fast_path_and_penalised_greedy():
    logits = torch.tensor([[0.1, 3.0, 2.9, 0.0], [2.0, 1.0, 0.0, 0.0]])
    sampler = Sampler(vocab_size=4, seed=0)
    out = sampler.sample(logits, [seq(temperature=0.0), seq(temperature=0.0, seq_id=1)])
    assert isinstance(out, SamplerOutput) and out.token_ids.tolist() == [1, 0] and out.logprobs is None
    # token 1 was generated before: repetition 1.2 gives 3.0 / 1.2 = 2.5 < 2.9
    out = sampler.sample(logits, [seq(temperature=0.0, output=[1], repetition_penalty=1.2),
                                  seq(temperature=0.0, seq_id=1, prompt=[0], repetition_penalty=3.0)])
    assert out.token_ids.tolist() == [2, 1]  # row 1: prompt token 0 penalised to 0.67 < 1.0


def test_greedy_rows_in_a_random_batch_are_argmax():
    sampler = Sampler(vocab_size=6, seed=0)
    seqs = [seq(seq_id=i, temperature=0.0 if i % 2 else 1.0) for i in range(200)]
    out = sampler.sample(LOGITS6.repeat(200, 1), seqs).token_ids
    assert (out[1::2] == 0).all() and len(set(out[0::2].tolist())) > 1


def test_grammar_bitmask_then_greedy():
    batch = build_sampling_batch([seq(temperature=0.0)], 6, grammar_bitmask=torch.tensor([[0b111110]],
                                                                                          dtype=torch.int32))
    assert Sampler(6).sample(LOGITS6[None], batch).token_ids.item() == 3  # token 0 is not allowed


def test_bad_words():
    assert bad_word_bans([4, 7, 8], [(7, 8, 9), (3,), (8, 2), (4, 7, 9)]) == [9, 3, 2]
    assert bad_word_bans([], [(7, 8), (3,)]) == [3]
    s = seq(output=[2, 4], temperature=0.0, bad_words_ids=((4, 0), (2, 3)))  # bans 0 (prefix 4 matched), not 3
    assert Sampler(6).sample(LOGITS6[None], [s]).token_ids.item() == 3


def test_min_tokens_masks_eos_and_stop_ids_until_reached():
    logits = torch.tensor([[0.0, 5.0, 4.0, 3.0]])  # EOS = 1 is the argmax, stop id 2 next
    sampler = Sampler(vocab_size=4, eos_token_ids=[EOS])
    mk = lambda out, **kw: seq(output=out, temperature=0.0, min_tokens=2, stop_token_ids=(2,), **kw)  # noqa: E731
    assert sampler.sample(logits, [mk([7])]).token_ids.item() == 3
    assert sampler.sample(logits, [mk([7, 7])]).token_ids.item() == 1
    assert sampler.sample(logits, [mk([7], ignore_eos=True)]).token_ids.item() == 1  # EOS is not a stop then


def test_seeded_request_is_reproducible_in_any_batch():
    vocab = 50
    torch.manual_seed(0)
    steps = [torch.randn(vocab) for _ in range(5)]
    params = dict(temperature=1.0, top_p=0.95, seed=1234)

    def run(batch_size, position):
        sampler = Sampler(vocab, seed=batch_size)  # a different engine RNG each time
        target = seq(seq_id=99, **params)
        others = [seq(seq_id=i, temperature=0.8, seed=i if i % 2 else None) for i in range(batch_size - 1)]
        tokens = []
        for logits in steps:
            seqs = others[:position] + [target] + others[position:]
            rows = torch.randn(batch_size, vocab)
            rows[position] = logits
            tokens.append(sampler.sample(rows, seqs).token_ids[position].item())
            target.output_token_ids.append(tokens[-1])
        return tokens

    a, b, c = run(1, 0), run(7, 3), run(4, 3)
    assert a == b == c
    sampler = Sampler(vocab, seed=0)  # another seed draws differently (overwhelmingly likely over 5 steps)
    other = seq(temperature=1.0, top_p=0.95, seed=99)
    assert [sampler.sample(s[None], [other]).token_ids.item() for s in steps] != a


def test_keys_are_seed_sequence_index_and_position():
    s0, s1 = seq(seed=5, output=[1, 2]), seq(seed=5, seq_index=1, seq_id=1)
    sampler = Sampler(10, seed=0)
    keys = sampler.build_batch([s0, s1]).keys
    assert (keys.seeds, keys.seq_indices, keys.positions) == ([5, 5], [0, 1], [2, 0])
    assert sampler.build_batch([s0], offsets=[3]).keys.positions == [5]
    # sequence 1 of seed 5 is not sequence 0 of seed 6 (as a seed offset by the index would make it)
    probs = torch.full((64, 10), 0.1)
    s6 = seq(seed=6, seq_id=2)
    a = [sampler.sample(probs[:1].log(), [s1]).token_ids.item()]
    b = [sampler.sample(probs[:1].log(), [s6]).token_ids.item()]
    for t in range(1, 12):
        s1.output_token_ids.append(a[-1])
        s6.output_token_ids.append(b[-1])
        a.append(sampler.sample(probs[:1].log(), [s1]).token_ids.item())
        b.append(sampler.sample(probs[:1].log(), [s6]).token_ids.item())
    assert a != b
    unseeded = seq(seq_id=3, temperature=1.0)
    first = sampler.seed_for(unseeded)
    assert sampler.seed_for(unseeded) == first and sampler.num_drawn_seeds == 1   # drawn once, kept
    assert sampler.seed_for(seq(seq_id=4, temperature=0.0)) == 0 and sampler.num_drawn_seeds == 1   # greedy: none
    sampler.drop([3])                                                  # finished sequences leave nothing behind
    assert sampler.num_drawn_seeds == 0


def test_logprobs_are_of_the_raw_distribution():
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0], [0.0, 0.0, 0.0, 3.0], [1.0, 1.0, 1.0, 1.0]])
    seqs = [seq(temperature=0.5, logprobs=2, presence_penalty=1.0, output=[0]),
            seq(seq_id=1, temperature=0.0, logprobs=0), seq(seq_id=2, temperature=0.0)]
    out = Sampler(4, seed=0).sample(logits, seqs)
    ref = logits.log_softmax(-1)
    lp0, lp1, lp2 = out.logprobs
    assert lp2 is None
    assert lp0.token_id == out.token_ids[0].item()
    assert math.isclose(lp0.logprob, ref[0, lp0.token_id].item(), rel_tol=1e-6)
    assert [t for t, _ in lp0.top] == [0, 1]
    assert all(math.isclose(v, ref[0, t].item(), rel_tol=1e-6) for t, v in lp0.top)
    assert lp1.token_id == 3 and lp1.top == [] and math.isclose(lp1.logprob, ref[1, 3].item(), rel_tol=1e-6)


def test_compute_probs_rows_for_speculative_decoding():
    """Rows = one sequence repeated with its output extended by drafts; greedy rows are one-hot."""
    s = seq(output=[0], temperature=1.0, top_k=2, frequency_penalty=2.0)
    g = seq(seq_id=1, temperature=0.0)
    batch = build_sampling_batch([s, s, g], 6, output_token_ids=[[0], [0, 3], []])
    probs = compute_probs(LOGITS6.repeat(3, 1), batch)
    torch.testing.assert_close(probs.sum(-1), torch.ones(3))
    assert (probs[0] > 0).nonzero().flatten().tolist() == [3, 4]   # 1.5 - 2 = -0.5 falls out of the top 2
    assert (probs[1] > 0).nonzero().flatten().tolist() == [1, 4]   # 0 and 3 penalised: 0.7, 0.2 lead
    assert probs[2].tolist() == [1.0, 0, 0, 0, 0, 0]


def test_batch_only_builds_what_rows_use():
    b = build_sampling_batch([seq(), seq(seq_id=1, top_k=0), seq(seq_id=2, top_k=99)], 10)
    assert b.top_k is None and b.top_p is None and b.min_p is None and not b.has_penalties and not b.has_masks
    b = build_sampling_batch([seq(top_k=3), seq(seq_id=1, repetition_penalty=1.1, prompt=[4])], 10)
    assert b.top_k.tolist() == [3, 10]
    assert b.prompt_token_ids.tolist() == [[10], [4]] and b.presence_penalty is None


def test_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match="do not match"):
        Sampler(6).sample(torch.zeros(2, 6), [seq()])


@pytest.mark.parametrize("params, output, plain", [
    (dict(temperature=0.0), [], True),
    (dict(temperature=0.0, min_tokens=2), [5], False),          # EOS still banned: needs the batch
    (dict(temperature=0.0, min_tokens=1), [5], True),
    (dict(temperature=0.0, repetition_penalty=1.1), [], False),
    (dict(temperature=0.0, logprobs=0), [], False),
    (dict(temperature=0.0, bad_words_ids=((3,),)), [], False),
    (dict(temperature=0.5), [], False),
])
def test_plain_greedy_rows_are_the_raw_argmax(params, output, plain):
    from backend.sampling.batch import is_plain_greedy
    s = seq(output=output, **params)
    assert is_plain_greedy(s) is plain
    if plain:   # the fast path must agree with the full sampler
        logits = torch.randn(1, 6, generator=torch.Generator().manual_seed(1))
        assert Sampler(6, eos_token_ids=[1]).sample(logits, [s]).token_ids.item() == int(logits.argmax())
