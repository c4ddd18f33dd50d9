"""``logit_bias`` in the sampler: the maths (``ops.apply_logit_bias``), its place in the order (after the penalties,
before temperature), every path (greedy rows, sampled rows, the greedy fast path, guided rows with the torch and
native mask kernels, speculative verification), and the grammar mask winning over any bias."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from backend.core.sequence import Sequence
from backend.native import native_ops
from backend.sampling.batch import build_sampling_batch, is_plain_greedy
from backend.sampling.bitmask_kernels import TORCH_KERNELS, BitmaskKernels
from backend.sampling.ops import NEG_INF, apply_logit_bias
from backend.sampling.processing import compute_probs
from backend.sampling.sampler import Sampler
from contracts.sampling_params import SamplingParams
from contracts.wire import LLMRequest
from tests.backend.sampling.test_sampler import chi2_critical, chi2_stat

LOGITS = torch.tensor([1.5, 0.2, -0.3, 1.0, 0.7, -1.2, 0.1, 0.4])   # argmax 0, then 3
VOCAB = LOGITS.shape[0]
BUILD = native_ops()
KERNELS = [pytest.param(TORCH_KERNELS, id="torch")] + (
    [pytest.param(BitmaskKernels.of(BUILD.ops), id="native")] if BUILD.available else [])
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"))]


def seq(seq_id=0, output=(), **params):
    return Sequence(seq_id=seq_id, request_id=f"r{seq_id}", seq_index=0, prompt_token_ids=[5, 6],
                    params=SamplingParams(**params), output_token_ids=list(output))


def mask_words(allowed: list[int], rows: int = 1) -> torch.Tensor:   # -> [rows, 1] int32: bit t set for t in allowed
    word = sum(1 << t for t in allowed)
    return torch.full((rows, 1), word - 2**32 if word >= 2**31 else word, dtype=torch.int32)


def test_apply_logit_bias_adds_per_row_and_never_lifts_a_mask():
    logits = torch.tensor([[0.0, 1.0, NEG_INF], [2.0, NEG_INF, 0.5]])
    out = apply_logit_bias(logits.clone(), torch.tensor([0, 0, 1]), torch.tensor([1, 2, 1]),
                           torch.tensor([-3.0, 100.0, 100.0]))
    assert out.tolist() == [[0.0, -2.0, NEG_INF], [2.0, NEG_INF, 0.5]]
    empty = torch.tensor([], dtype=torch.int64)
    assert apply_logit_bias(logits.clone(), empty, empty, torch.tensor([])).equal(logits)


@pytest.mark.parametrize("bad", [((1, 100.5),), ((1, -101.0),), ((1, float("nan")),), ((1, float("inf")),),
                                 ((-1, 1.0),), ((1, 1.0), (1, 2.0)), ((True, 1.0),), ((1, "5"),)])
def test_params_refuse_a_bad_bias_naming_the_field(bad):
    with pytest.raises(ValueError, match=r"^logit_bias: "):
        SamplingParams(logit_bias=bad)


def test_params_cross_the_wire():
    p = SamplingParams(logit_bias=((7, -100.0), (3, 2.5)), temperature=0.0, ignore_eos=True)
    back = LLMRequest.from_json(LLMRequest(sampling=p).to_json()).sampling
    assert back == p and back.logit_bias == ((7, -100.0), (3, 2.5))


def test_a_biased_greedy_row_is_not_plain():
    assert is_plain_greedy(seq(temperature=0.0)) and not is_plain_greedy(seq(temperature=0.0, logit_bias=((1, 1.0),)))


@pytest.mark.parametrize("rows", [1, 3])
def test_greedy_plus_100_forces_and_minus_100_bans(rows):
    sampler = Sampler(vocab_size=VOCAB)
    logits = LOGITS.repeat(rows, 1)
    assert sampler.sample(logits, [seq(i, temperature=0.0) for i in range(rows)]).token_ids.tolist() == [0] * rows
    forced = sampler.sample(logits, [seq(i, temperature=0.0, logit_bias=((5, 100.0),)) for i in range(rows)])
    assert forced.token_ids.tolist() == [5] * rows
    banned = sampler.sample(logits, [seq(i, temperature=0.0, logit_bias=((0, -100.0),)) for i in range(rows)])
    assert banned.token_ids.tolist() == [3] * rows
    mixed = sampler.sample(logits[:1].repeat(2, 1), [seq(0, temperature=0.0), seq(1, temperature=0.0,
                                                                                   logit_bias=((6, 1.5),))])
    assert mixed.token_ids.tolist() == [0, 6]                                 # 0.1 + 1.5 > 1.5 only in its row


def test_bias_applies_after_the_penalties_and_before_temperature():
    """probs = softmax((penalised logits + bias) / T): by hand, with a repetition penalty on an output token."""
    s = seq(temperature=0.5, repetition_penalty=2.0, output=[3], logit_bias=((3, 1.0), (7, -0.5)))
    probs = compute_probs(LOGITS[None], build_sampling_batch([s], VOCAB))[0]
    x = LOGITS.double().clone()
    x[[3, 5, 6]] = torch.tensor([1.0 / 2.0, -1.2 * 2.0, 0.1 / 2.0], dtype=torch.float64)  # seen: output 3, prompt 5, 6
    x[3] += 1.0
    x[7] -= 0.5
    assert torch.allclose(probs.double(), (x / 0.5).softmax(-1), atol=1e-6)


def test_sampled_draws_follow_the_biased_distribution():
    n, params = 6000, dict(temperature=0.8, logit_bias=((2, 1.7), (0, -1.0)))
    sampler = Sampler(vocab_size=VOCAB, seed=3)
    out = sampler.sample(LOGITS.repeat(n, 1), [seq(i, **params) for i in range(n)])
    counts = torch.bincount(out.token_ids, minlength=VOCAB).double()
    want = ((LOGITS + torch.tensor([-1.0, 0, 1.7, 0, 0, 0, 0, 0])) / 0.8).softmax(-1).double()
    stat, df = chi2_stat(counts, want)
    assert stat < chi2_critical(df), (stat, counts.tolist(), want.tolist())


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_grammar_mask_wins_over_any_bias(kernels, temperature):
    """Allowed {1, 3, 4}: +100 on a forbidden token is never drawn; -100 on the allowed argmax moves to the
    next allowed one (greedy); +100 on an allowed token takes it; a row allowing one token keeps it whatever its bias."""
    sampler = Sampler(vocab_size=VOCAB, seed=1, bitmask_kernels=kernels)
    rows = 400 if temperature else 2
    mask = mask_words([1, 3, 4], rows)
    for bias, greedy in ((((0, 100.0),), 3), (((3, -100.0),), 4), (((1, 100.0), (0, 100.0)), 1)):
        out = sampler.sample(LOGITS.repeat(rows, 1), sampler.build_batch(
            [seq(i, temperature=temperature, seed=i, logit_bias=bias) for i in range(rows)], grammar_bitmask=mask))
        assert set(out.token_ids.tolist()) <= {1, 3, 4}, bias
        if not temperature:
            assert out.token_ids.tolist() == [greedy] * rows, bias
        elif bias[0] == (1, 100.0):
            assert out.token_ids.tolist() == [1] * rows                        # +100 leaves no room for others
    one = sampler.sample(LOGITS.repeat(2, 1), sampler.build_batch(
        [seq(i, temperature=temperature, seed=i, logit_bias=((4, -100.0), (0, 100.0))) for i in range(2)],
        grammar_bitmask=mask_words([4], 2)))
    assert one.token_ids.tolist() == [4, 4]


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_verification_includes_the_bias(temperature):
    """Coupled verification accepts exactly the drafts plain biased steps would emit, and rejects the first
    unbiased argmax when the bias moves the choice."""
    sampler = Sampler(vocab_size=VOCAB, seed=5)
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(5, VOCAB, generator=gen) * 2
    params = dict(temperature=temperature, seed=11, logit_bias=((2, 3.0), (int(logits[0].argmax()), -100.0)))
    plain, s = [], seq(**params)
    for j in range(5):                                  # position j sees the tokens before it as output
        step = seq(output=plain, **params)
        plain.append(sampler.sample(logits[j:j + 1], [step]).token_ids.item())
    out = sampler.verify(logits, [s], [plain[:4]])
    assert out.token_ids == [plain] and out.num_accepted == [4]
    unbiased = int(logits[0].argmax())                  # banned by the bias: rejected, the biased draw emitted
    out = sampler.verify(logits[:2], [s], [[unbiased]])
    assert out.token_ids == [[plain[0]]] and plain[0] != unbiased


@pytest.mark.parametrize("device", DEVICES)
def test_every_rule_on_the_device(device):
    """The sampler's tensors on ``device`` (the CUDA path is the same tensor ops): greedy forced and banned, a
    sampled row under a grammar mask, coupled verification."""
    sampler = Sampler(vocab_size=VOCAB, device=device, seed=2)
    logits = LOGITS.to(device).repeat(3, 1)
    rows = [seq(0, temperature=0.0, logit_bias=((5, 100.0),)), seq(1, temperature=0.0, logit_bias=((0, -100.0),)),
            seq(2, temperature=0.7, seed=4, logit_bias=((0, 100.0), (1, 1.0)))]
    mask = torch.cat([mask_words(list(range(VOCAB)), 2), mask_words([1, 3, 4])]).to(device)
    out = sampler.sample(logits, sampler.build_batch(rows, grammar_bitmask=mask)).token_ids.tolist()
    assert out[:2] == [5, 3] and out[2] in (1, 3, 4)
    assert sampler.verify(logits[:2], [rows[0]], [[5]]).token_ids == [[5, 5]]


def test_probabilities_of_verify_rows_carry_the_bias():
    s = seq(temperature=1.0, logit_bias=((6, 4.0),))
    batch = build_sampling_batch([s, s], VOCAB)
    probs = compute_probs(LOGITS.repeat(2, 1), batch)
    plain = compute_probs(LOGITS.repeat(2, 1), build_sampling_batch([dataclasses.replace(s, params=SamplingParams())] * 2,
                                                                      VOCAB))
    assert (probs[:, 6] > plain[:, 6] * 10).all()
