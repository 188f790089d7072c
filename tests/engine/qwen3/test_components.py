"""Small pieces against plain references: MRoPE == RoPE on text positions, the sampler's semantics."""

from __future__ import annotations

import math

import pytest
import torch

from voicewire.engine.qwen3.rope import cos_sin, inv_freq, mrope_cos_sin
from voicewire.engine.qwen3.sampler import (
    RowParams,
    apply_repetition_penalty,
    exponential_noise,
    sample,
    uniform_open,
)


def test_mrope_with_equal_position_streams_is_plain_rope() -> None:
    freqs = inv_freq(128, 1e6)
    pos = torch.arange(0, 3000, 7)[None]  # (1, P)
    plain = cos_sin(pos, freqs)
    for interleaved in (True, False):
        mrope = mrope_cos_sin(pos.expand(3, -1)[:, None], freqs, (24, 20, 20), interleaved)
        for a, b in zip(plain, mrope, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_interleaved_mrope_takes_frequency_f_from_stream_f_mod_3() -> None:
    freqs = inv_freq(16, 1e4)
    pos = torch.tensor([5, 11, 17])[:, None, None]  # t, h, w streams differ
    cos, _ = mrope_cos_sin(pos, freqs, (4, 2, 2), interleaved=True)
    angles = torch.acos(cos[0, 0, :8].clamp(-1, 1))
    expect_stream = [0, 1, 2, 0, 1, 2, 0, 0]  # h, w sections end after 2 interleaved slots each
    for f, s in enumerate(expect_stream):
        want = (float(pos[s]) * float(freqs[f])) % (2 * math.pi)
        want = min(want, 2 * math.pi - want)
        assert abs(float(angles[f]) - want) < 1e-4, f


def _params(
    b: int, greedy: bool = False, temp: float = 1.0, top_k: int = 10**9, top_p: float = 1.0, seed: int = 0
) -> RowParams:
    return RowParams(
        greedy=torch.full((b,), greedy),
        temperature=torch.full((b,), temp),
        top_k=torch.full((b,), top_k, dtype=torch.int64),
        top_p=torch.full((b,), top_p),
        seed=torch.full((b,), seed, dtype=torch.int64),
        step=torch.arange(b, dtype=torch.int64),
    )


def test_repetition_penalty_matches_hf_semantics() -> None:
    scores = torch.tensor([[2.0, -2.0, 1.0, -1.0]])
    seen = torch.tensor([[True, True, False, False]])
    out = apply_repetition_penalty(scores, seen, torch.tensor([1.05]))
    torch.testing.assert_close(out, torch.tensor([[2.0 / 1.05, -2.0 * 1.05, 1.0, -1.0]]))


def test_greedy_rows_take_the_argmax() -> None:
    scores = torch.randn(6, 50)
    p = _params(6, greedy=True, temp=0.5, top_k=3)
    torch.testing.assert_close(sample(scores, p, 0), scores.argmax(-1))
    torch.testing.assert_close(sample(scores, p, 0, any_drawn=False), scores.argmax(-1))


def test_top_k_and_top_p_bound_the_support() -> None:
    torch.manual_seed(0)
    scores = torch.randn(1, 40).expand(4000, 40).contiguous()
    p = _params(4000, top_k=5)
    drawn = sample(scores, p, 0)
    assert set(drawn.tolist()) == set(scores[0].topk(5).indices.tolist())
    # top-p: the smallest set whose probability reaches p, as HF keeps it
    probs = scores[0].softmax(-1)
    order = probs.argsort(descending=True)
    keep = int((probs[order].cumsum(0) < 0.6).sum()) + 1
    drawn = sample(scores, _params(4000, top_p=0.6), 0)
    assert set(drawn.tolist()) == set(order[:keep].tolist())


def test_draws_follow_the_tempered_distribution() -> None:
    logits = torch.tensor([0.0, 1.0, 2.0, -1.0])
    n = 20000
    p = _params(n, temp=0.7)
    p.seed = torch.arange(n, dtype=torch.int64) * 7919  # one draw per seed
    drawn = sample(logits.expand(n, 4).contiguous(), p, 3)
    freq = torch.bincount(drawn, minlength=4).float() / n
    torch.testing.assert_close(freq, (logits / 0.7).softmax(-1), rtol=0, atol=0.015)


@pytest.mark.parametrize("vocab", [2048, 3072])
def test_noise_is_a_function_of_seed_step_and_codebook(vocab: int) -> None:
    seed = torch.tensor([1, 1, 2, 1], dtype=torch.int64)
    step = torch.tensor([0, 0, 0, 1], dtype=torch.int64)
    e = exponential_noise(seed, step, 4, vocab)
    assert e.shape == (4, vocab) and bool((e > 0).all()) and bool(torch.isfinite(e).all())
    torch.testing.assert_close(e[0], e[1], rtol=0, atol=0)
    assert not torch.equal(e[0], e[2]) and not torch.equal(e[0], e[3])
    assert not torch.equal(e[0], exponential_noise(seed, step, 5, vocab)[0])
    assert abs(float(e.mean()) - 1.0) < 0.05  # Exp(1)


def test_uniform_noise_stays_strictly_inside_0_1_at_the_extreme_hashes() -> None:
    # u == 1 would make the Exp(1) noise 0, and p / 0 = NaN would win the argmax for a token of
    # probability 0 (a suppressed control id for the talker): seen on the GPU under load
    r = torch.tensor([0, 1, 511, 512, 2**31, 2**32 - 512, 2**32 - 1], dtype=torch.int64)
    u = uniform_open(r)
    assert bool((u > 0).all()) and bool((u < 1).all())
    assert bool((-torch.log(u) > 0).all())
