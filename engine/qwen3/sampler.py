"""Batched sampling with per-row parameters, on the device, with no host sync.

Same processing as the reference (Hugging Face ``generate`` with the package's arguments), in its
order:

    talker (codebook 0):   repetition penalty over the stream's earlier codebook-0 codes
                        -> EOS masked (first ``min_new_tokens`` frames, or always when the length is forced)
                        -> suppressed control ids (the top 1024 of the vocabulary except EOS)
    code predictor (1..15): nothing
    then, per row: greedy -> argmax; else temperature -> top-k -> top-p -> sample.

Sampling draws from the processed distribution with the exponential race (argmax of p / E,
E ~ Exp(1)), where the noise comes from a counter-based hash of (stream seed, frame, codebook,
token). So a stream's samples depend on its seed alone, not on which other streams share the batch
or on a global RNG, and the step is free of host syncs (CUDA-graph friendly).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

_M32 = 0xFFFFFFFF


@dataclass
class RowParams:
    """Per-row sampling parameters for one batch, all (B,) device tensors."""

    greedy: Tensor  # bool
    temperature: Tensor  # float32, > 0
    top_k: Tensor  # int64; >= vocab disables
    top_p: Tensor  # float32; 1.0 disables
    seed: Tensor  # int64, 0 <= seed < 2**32
    step: Tensor  # int64 frame index of the stream


def apply_repetition_penalty(scores: Tensor, seen: Tensor, penalty: Tensor) -> Tensor:
    """scores (B, V) float32; seen (B, V) bool; penalty (B,) -> penalized scores (HF semantics)."""
    p = penalty[:, None]
    penalized = torch.where(scores < 0, scores * p, scores / p)
    return torch.where(seen, penalized, scores)


def sample(scores: Tensor, params: RowParams, codebook: int, any_drawn: bool = True) -> Tensor:
    """scores (B, V) float32 after the model-specific processors -> (B,) int64 tokens.

    ``any_drawn=False`` (the host knows every row is greedy) skips the sampling work.
    """
    greedy = scores.argmax(dim=-1)
    if not any_drawn:
        return greedy
    s = scores / params.temperature[:, None]
    # top-k: drop everything below the k-th largest (ties at the k-th value stay, as in HF)
    sorted_desc = s.sort(dim=-1, descending=True).values
    k = params.top_k.clamp(1, s.shape[-1])
    kth = sorted_desc.gather(1, (k - 1)[:, None])
    s = s.masked_fill(s < kth, float("-inf"))
    # top-p: drop the smallest tokens whose cumulative probability stays <= 1 - p; keep the max
    sorted_asc, order = s.sort(dim=-1)
    cum = sorted_asc.softmax(dim=-1).cumsum(dim=-1)
    drop_sorted = cum <= (1.0 - params.top_p[:, None])
    drop_sorted[:, -1] = False
    drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
    s = s.masked_fill(drop, float("-inf"))
    probs = s.softmax(dim=-1)
    noise = exponential_noise(params.seed, params.step, codebook, s.shape[-1])
    drawn = (probs / noise).argmax(dim=-1)
    return torch.where(params.greedy, greedy, drawn)


def exponential_noise(seed: Tensor, step: Tensor, codebook: int, vocab: int) -> Tensor:
    """Exp(1) noise (B, V) from a hash of (seed, step, codebook, token index): reproducible per row."""
    h = _mix32(seed & _M32)
    h = _mix32(h ^ (step & _M32))
    h = _mix32(h ^ codebook)  # (B,)
    idx = torch.arange(vocab, device=seed.device, dtype=torch.int64)
    r = _mix32((h[:, None] + _mul32(idx, 0x9E3779B9)[None, :]) & _M32)  # (B, V) in [0, 2**32)
    return -torch.log(uniform_open(r))


def uniform_open(r: Tensor) -> Tensor:
    """32-bit hashes -> float32 u strictly inside (0, 1).

    23 bits: (k + 0.5) / 2**23 needs 24 significant bits at most, so it is exact in float32 and
    u <= 1 - 2**-24. (24 bits were used first: (2**24 - 0.5) / 2**24 rounds to 1.0 in float32, so once
    in 2**24 draws the noise was 0, p / 0 gave NaN for every zero-probability token and argmax picked
    a suppressed control id: seen on the H200 as 5 invalid frames in ~50k under load.)
    """
    return ((r >> 9).to(torch.float32) + 0.5) * (1.0 / (1 << 23))


def _mul32(x: Tensor, c: int) -> Tensor:
    """(x * c) mod 2**32 for 0 <= x < 2**32 without overflowing int64 (16-bit halves)."""
    lo = (x & 0xFFFF) * c
    hi = ((x >> 16) * c) & 0xFFFF
    return (lo + (hi << 16)) & _M32


def _mix32(x: Tensor) -> Tensor:
    """A 32-bit integer finalizer (lowbias32) on int64 tensors holding values < 2**32."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)
