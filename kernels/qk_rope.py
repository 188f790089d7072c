"""Qwen3's per-head q / k RMS norm and RoPE as Triton device functions, rounded where the unfused layers
round (engine/qwen3/rope.py, layers.py): the prologue kernel (qk_norm_rope.py) and the attention kernel
that folds the prologue in (decode_attention.py) both compute it with these."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def rope_angles(pos, inv_freq_ptr, d, dtype: tl.constexpr):
    """cos and sin (D / 2,) of position ``pos``: fp32 from the position, rounded to ``dtype``."""
    angle = pos.to(tl.float32) * tl.load(inv_freq_ptr + d)
    return tl.cos(angle).to(dtype).to(tl.float32), tl.sin(angle).to(dtype).to(tl.float32)


@triton.jit
def rms_rope(x1, x2, w1, w2, cos, sin, eps, HEAD_DIM: tl.constexpr):
    """RMS-normed, weight-scaled and rotated halves (H, D / 2) of a row's heads (reference rounding)."""
    dtype = x1.dtype
    f1, f2 = x1.to(tl.float32), x2.to(tl.float32)
    rstd = tl.math.rsqrt((tl.sum(f1 * f1, axis=1) + tl.sum(f2 * f2, axis=1)) / HEAD_DIM + eps)[:, None]
    n1 = ((f1 * rstd).to(dtype).to(tl.float32) * w1[None, :]).to(dtype).to(tl.float32)
    n2 = ((f2 * rstd).to(dtype).to(tl.float32) * w2[None, :]).to(dtype).to(tl.float32)
    # x * cos + cat(-x2, x1) * sin, each product rounded, then the sum
    c, s = cos[None, :], sin[None, :]
    o1 = (n1 * c).to(dtype).to(tl.float32) + (-n2 * s).to(dtype).to(tl.float32)
    o2 = (n2 * c).to(dtype).to(tl.float32) + (n1 * s).to(dtype).to(tl.float32)
    return o1.to(dtype), o2.to(dtype)


@triton.jit
def rope_heads(heads_ptr, ok, norm_ptr, cos, sin, eps, HEAD_DIM: tl.constexpr):
    """Whole heads (H, D), normed and rotated: ``heads_ptr`` (H, 1) points at each head's first element
    of a q|k|v row, ``ok`` (H, 1) masks the heads that exist (the others come out 0)."""
    half: tl.constexpr = HEAD_DIM // 2
    d = tl.arange(0, half)
    w1 = tl.load(norm_ptr + d).to(tl.float32)
    w2 = tl.load(norm_ptr + half + d).to(tl.float32)
    x1 = tl.load(heads_ptr + d[None, :], mask=ok, other=0.0)
    x2 = tl.load(heads_ptr + half + d[None, :], mask=ok, other=0.0)
    o1, o2 = rms_rope(x1, x2, w1, w2, cos, sin, eps, HEAD_DIM)
    # [o1 | o2] along D: join pairs them as (H, D / 2, 2); moving the pair axis ahead makes it the halves
    return tl.reshape(tl.permute(tl.join(o1, o2), (0, 2, 1)), (o1.shape[0], HEAD_DIM))


__all__ = ["rms_rope", "rope_angles", "rope_heads"]
