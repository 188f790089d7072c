"""SnakeBeta, the codec decoder's activation, in one pass: y = x + sin(x * a_c)^2 / b_c per channel c.

    x (B, C, T) any strides -> y (B, C, T) contiguous; a = exp(alpha), inv_b = 1 / (exp(beta) + 1e-9)
    (C,) float32, computed once from the parameters (engine/qwen3/codec_decoder.py: SnakeBeta).

Eager one SnakeBeta is 9 kernels, 5 of them over the whole activation (x * a, sin, square, scale,
add: 11 passes over it). The codec decoder runs 29 per call on ~2.8 M activation elements per decoded
frame (up to 96 channels x 1,920 samples): ~60 MB of bf16 traffic per frame and 261 launches per
codec graph. Here: one launch, one read and one write (~11 MB per frame), fp32 math, one rounding.

Algorithm: the output is walked as a flat array in BLOCK-sized pieces; each element's (b, c, t) comes
from its flat index, its channel's two constants from a gather that stays in L1.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from voicewire.kernels.launch_checks import SUPPORTED_DTYPES, check_kernel_device

BLOCK = 1024  # elements per program: 8 per thread at 4 warps


@triton.jit
def _snake_kernel(
    x_ptr,
    out_ptr,
    a_ptr,
    inv_b_ptr,
    n,
    C,
    T,
    stride_b,
    stride_c,
    stride_t,
    BLOCK: tl.constexpr,
):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = i < n
    t = i % T
    bc = i // T
    c = bc % C
    b = bc // C
    x = tl.load(x_ptr + b * stride_b + c * stride_c + t * stride_t, mask=ok, other=0.0).to(tl.float32)
    a = tl.load(a_ptr + c, mask=ok, other=0.0)
    inv_b = tl.load(inv_b_ptr + c, mask=ok, other=0.0)
    s = tl.sin(x * a)
    tl.store(out_ptr + i, (x + inv_b * s * s).to(out_ptr.dtype.element_ty), mask=ok)


def snake(x: torch.Tensor, a: torch.Tensor, inv_b: torch.Tensor) -> torch.Tensor:
    """x (B, C, T) bf16 / fp16 / fp32; a, inv_b (C,) float32 on x's device -> (B, C, T) in x's dtype."""
    if x.dim() != 3:
        raise ValueError(f"x must be (B, C, T), got {tuple(x.shape)}")
    c = x.shape[1]
    if x.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"x must be one of {SUPPORTED_DTYPES}, got {x.dtype}")
    for name, p in (("a", a), ("inv_b", inv_b)):
        if p.shape != (c,) or p.dtype != torch.float32 or p.device != x.device or p.stride(0) != 1:
            raise ValueError(
                f"{name} must be contiguous float32 ({c},) on {x.device}, got {p.dtype} {tuple(p.shape)}"
            )
    check_kernel_device(x.device)
    out = torch.empty(x.shape, device=x.device, dtype=x.dtype)
    n = x.numel()
    if n:
        _snake_kernel[(triton.cdiv(n, BLOCK),)](
            x,
            out,
            a,
            inv_b,
            n,
            c,
            x.shape[2],
            x.stride(0),
            x.stride(1),
            x.stride(2),
            BLOCK=BLOCK,
            num_warps=4,
        )
    return out


__all__ = ["snake"]
