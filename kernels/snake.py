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
from voicewire.kernels.reference import snake_reference

ELEMENTS = 4096  # per program: a (rows x columns) tile of the output

# sin^2 has period pi: z is reduced to r = z - k pi in [-pi/2, pi/2] (pi split in two floats, so the
# reduction stays exact to ~1e-7 for |z| up to ~1e5), then sin r is an odd Taylor polynomial to r^11,
# within 6e-8 of sin on that interval. Libdevice's sinf does a three-part reduction with a branch to
# a slow path for large arguments: about 3x the instructions, and this kernel is bound by them.
INV_PI = tl.constexpr(0.3183098861837907)
PI_HI = tl.constexpr(3.1415927410125732)  # float32(pi)
PI_LO = tl.constexpr(-8.742278012618954e-08)  # pi - PI_HI
SIN_C3, SIN_C5, SIN_C7 = tl.constexpr(-1.0 / 6), tl.constexpr(1.0 / 120), tl.constexpr(-1.0 / 5040)
SIN_C9, SIN_C11 = tl.constexpr(1.0 / 362880), tl.constexpr(-1.0 / 39916800)


@triton.jit
def _sin_squared(z):
    k = tl.floor(z * INV_PI + 0.5)
    r = tl.fma(k, -PI_HI, z)
    r = tl.fma(k, -PI_LO, r)
    r2 = r * r
    p = tl.fma(r2, SIN_C11, SIN_C9)
    p = tl.fma(r2, p, SIN_C7)
    p = tl.fma(r2, p, SIN_C5)
    p = tl.fma(r2, p, SIN_C3)
    s = tl.fma(r * r2, p, r)
    return s * s


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
    PAIR: tl.constexpr,
    WHOLE_HALVES: tl.constexpr,  # a pair's column tile lies in one half (BW divides C)
):
    # Index math per row, per column or per program, never per element (an integer division is tens
    # of instructions): a plain or prefix tile reads one source row per output row, and so does a
    # pair's tile that lies within one half; only a pair with BW not dividing C needs one per element.
    r = tl.program_id(0) * BR + tl.arange(0, BR)
    w = tl.program_id(1) * BW + tl.arange(0, BW)
    b = (r // L).to(tl.int64)
    row = r % L
    ok = (r < R)[:, None] & (w < W)[None, :]
    if not PAIR:
        c = w
        src = (row - X_OFF)[:, None]  # x's row; < 0: a prefix row
    elif WHOLE_HALVES:
        half = (tl.program_id(1) * BW) // C  # 0: y_t, 1: y_{t-1}
        c = w - half * C
        src = (row - half)[:, None]
    else:
        c = w % C
        src = row[:, None] - (w // C)[None, :]
    from_x = ok & (src >= 0)
    from_pre = ok & (src < 0)
    x = tl.load(x_ptr + b[:, None] * sxb + src.to(tl.int64) * sxt + c[None, :], mask=from_x, other=0.0)
    pre = tl.load(pre_ptr + b[:, None] * spb + (src + P).to(tl.int64) * spt + c[None, :], mask=from_pre, other=0.0)
    cm = w < W
    v = x.to(tl.float32) + tl.load(shift_ptr + c, mask=cm, other=0.0)[None, :]
    s2 = _sin_squared(v * tl.load(a_ptr + c, mask=cm, other=0.0)[None, :])
    y = tl.fma(tl.load(inv_b_ptr + c, mask=cm, other=0.0)[None, :], s2, v)
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
        # a tile's columns within one channel block (and, for a pair, within one half)
        bw = 64 if c % 64 == 0 else 32 if c % 32 == 0 else min(64, triton.next_power_of_2(width))
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
            PAIR=pair,
            WHOLE_HALVES=pair and c % bw == 0,
            num_warps=4,
        )
    return out


__all__ = ["snake", "snake_reference"]
