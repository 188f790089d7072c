"""SnakeBeta, the codec decoder's activation, in one pass over time-major (B, T, C) activations:

    y = v + sin(v * a_c)^2 * inv_b_c   with v = x + shift_c     (a = exp(alpha), inv_b = 1 / (exp(beta) + 1e-9))

``shift`` is the bias of the layer before, which the decoder does not add on its own (one pass over
the activation fewer per conv, engine/qwen3/codec_decoder.py). The output is laid out for the layer
after, so that no concatenation follows:

* plain            out (B, T, C)
* ``prefix`` (B, P, C)  out (B, P + T, C): the prefix rows (a causal conv's history, already
                   activated), then the T activated rows: the conv's input, whole
* ``pair=True``    out (B, T, 2C): row t is [y_t, y_{t-1}], y_{-1} = prefix row 0 (P = 1): a
                   transposed conv of kernel 2s and stride s is then one matmul of this by its
                   (2 C, s C') weight

Eager, one SnakeBeta was 9 kernels and 11 passes over the activation; the decoder runs 29 per call
on up to 96 channels x 1,920 samples per frame. Here: one launch, one read (two for ``pair``), one
write, fp32 math, one rounding. Channels are the innermost axis of every tensor, so a program's
loads and stores are coalesced; a program writes a tile of output rows x columns.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from voicewire.kernels.launch_checks import SUPPORTED_DTYPES, check_kernel_device

ELEMENTS = 4096  # per program: a (rows x columns) tile of the output


@triton.jit
def _snake_kernel(
    x_ptr,
    pre_ptr,
    out_ptr,
    shift_ptr,
    a_ptr,
    inv_b_ptr,
    R,  # output rows, B * L
    L,  # out rows per batch row
    W,  # out columns: C, or 2 C for a pair
    C,
    P,  # prefix rows
    X_OFF,  # out row of x's row 0: P (prefix), 0 (plain, pair)
    sxb,
    sxt,
    spb,
    spt,
    BR: tl.constexpr,
    BW: tl.constexpr,
):
    # Index math per row and per column of the tile, not per element: an integer division is tens
    # of instructions, and a flat index would need six of them for each element.
    r = tl.program_id(0) * BR + tl.arange(0, BR)
    w = tl.program_id(1) * BW + tl.arange(0, BW)
    b = (r // L).to(tl.int64)
    row = r % L
    c = w % C
    src = row[:, None] - X_OFF - (w // C)[None, :]  # x's row for this element; < 0: a prefix row
    ok = (r < R)[:, None] & (w < W)[None, :]
    from_x = ok & (src >= 0)
    from_pre = ok & (src < 0)
    x = tl.load(x_ptr + b[:, None] * sxb + src.to(tl.int64) * sxt + c[None, :], mask=from_x, other=0.0)
    pre = tl.load(pre_ptr + b[:, None] * spb + (src + P).to(tl.int64) * spt + c[None, :], mask=from_pre, other=0.0)
    cm = w < W
    v = x.to(tl.float32) + tl.load(shift_ptr + c, mask=cm, other=0.0)[None, :]
    s = tl.sin(v * tl.load(a_ptr + c, mask=cm, other=0.0)[None, :])
    y = v + tl.load(inv_b_ptr + c, mask=cm, other=0.0)[None, :] * s * s
    y = tl.where(from_x, y, pre.to(tl.float32))
    out = out_ptr + r.to(tl.int64)[:, None] * W + w[None, :]
    tl.store(out, y.to(out_ptr.dtype.element_ty), mask=ok)


def snake(
    x: torch.Tensor,
    a: torch.Tensor,
    inv_b: torch.Tensor,
    shift: torch.Tensor | None = None,
    prefix: torch.Tensor | None = None,
    pair: bool = False,
) -> torch.Tensor:
    """x (B, T, C) bf16 / fp16 / fp32 with unit channel stride; a, inv_b, shift (C,) float32 on x's
    device; prefix (B, P, C) in x's dtype, unit channel stride (P = 1 for ``pair``) -> the layout of
    the module docstring, contiguous, in x's dtype."""
    if x.dim() != 3:
        raise ValueError(f"x must be (B, T, C), got {tuple(x.shape)}")
    b, t, c = x.shape
    if x.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"x must be one of {SUPPORTED_DTYPES}, got {x.dtype}")
    shift = a.new_zeros(c) if shift is None else shift
    for name, p in (("a", a), ("inv_b", inv_b), ("shift", shift)):
        if p.shape != (c,) or p.dtype != torch.float32 or p.device != x.device or p.stride(0) != 1:
            raise ValueError(
                f"{name} must be contiguous float32 ({c},) on {x.device}, got {p.dtype} {tuple(p.shape)}"
            )
    if pair and (prefix is None or prefix.shape[1] != 1):
        raise ValueError("a pair needs the row before x as a (B, 1, C) prefix")
    if prefix is not None and (
        prefix.dim() != 3 or prefix.shape[0] != b or prefix.shape[2] != c or prefix.dtype != x.dtype
    ):
        raise ValueError(f"prefix must be ({b}, P, {c}) {x.dtype}, got {prefix.dtype} {tuple(prefix.shape)}")
    for name, t3 in (("x", x), ("prefix", prefix)):
        if t3 is not None and t3.stride(2) != 1 and c > 1:
            raise ValueError(f"{name} must have unit channel stride, got strides {t3.stride()}")
    check_kernel_device(x.device)
    n_pre = 0 if prefix is None else prefix.shape[1]
    if pair:
        rows, width, x_off = t, 2 * c, 0
    else:
        rows, width, x_off = n_pre + t, c, n_pre
    out = torch.empty(b, rows, width, device=x.device, dtype=x.dtype)
    pre = x if prefix is None else prefix  # never read without a prefix (masked)
    if out.numel():
        bw = 64 if width % 64 == 0 else 32 if width % 32 == 0 else min(64, triton.next_power_of_2(width))
        br = ELEMENTS // bw
        _snake_kernel[(triton.cdiv(b * rows, br), triton.cdiv(width, bw))](
            x,
            pre,
            out,
            shift,
            a,
            inv_b,
            b * rows,
            rows,
            width,
            c,
            n_pre,
            x_off,
            x.stride(0),
            x.stride(1),
            pre.stride(0),
            pre.stride(1),
            BR=br,
            BW=bw,
            num_warps=4,
        )
    return out


def snake_reference(
    x: torch.Tensor,
    a: torch.Tensor,
    inv_b: torch.Tensor,
    shift: torch.Tensor | None = None,
    prefix: torch.Tensor | None = None,
    pair: bool = False,
) -> torch.Tensor:
    """``snake`` in torch ops (any device; the path without Triton), the same fp32 math and layouts."""
    v = x.float() + (0.0 if shift is None else shift)
    y = (v + inv_b * torch.sin(v * a).pow(2)).to(x.dtype)
    if pair:
        if prefix is None:
            raise ValueError("a pair needs the row before x as a (B, 1, C) prefix")
        return torch.cat((y, torch.cat((prefix, y[:, :-1]), dim=1)), dim=2)
    return y if prefix is None else torch.cat((prefix, y), dim=1)


__all__ = ["snake", "snake_reference"]
