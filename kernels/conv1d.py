"""A dense 1-D convolution over time-major activations, as one implicit GEMM:

    out[b, t, :] = bias + sum_j  xx[b, t + j d, :] @ W_j        t < L - (K - 1) d

xx (B, L, Cin) is a causal conv's whole input (its history, then the new steps), W (K Cin, Cout) the
taps stacked: output positions are the GEMM's rows (B x T of them, across batch rows), each tap's
input rows are the same positions shifted by j d, read where they lie (no im2col buffer, no layout
transform). The codec decoder's dense convs (k = 3 and 7) can run on it (engine/qwen3/codec_decoder.py).

Why not cuDNN: cuDNN's fast algorithm for these shapes differs per (rows, length), and torch finds
it only by timing candidates in the process, once per shape, on every start; with a graph per
(rows, frames) that timing was most of a server's start-up. This kernel's tiles are fixed per
channel widths, so its compiled code is reused at every length and cached on disk across starts.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from voicewire.kernels.launch_checks import (
    INTERPRETER_BLOCK_N,
    MIN_DOT_DIM,
    SUPPORTED_DTYPES,
    check_same_device_unit_stride,
    interpreter_enabled,
)


# the lengths change with every call's shape: one compiled variant serves them all (their alignment
# tells the loads nothing; the channel widths, which do, stay specialized)
@triton.jit(do_not_specialize=["M", "T", "L"])
def _conv_kernel(
    x_ptr,
    w_ptr,
    bias_ptr,
    out_ptr,
    M,  # output positions, B * T
    T,  # output positions per batch row
    L,  # input positions per batch row, T + (K - 1) * DIL
    CIN,
    COUT,
    DIL,
    K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,  # BLOCK_K divides CIN: no channel mask on the loads
    DOT_PRECISION: tl.constexpr,
):
    m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    kk = tl.arange(0, BLOCK_K)
    m_ok = m < M
    n_ok = n < COUT
    # each output position's first input row: the division is per row of the tile, not per element
    first = ((m // T) * L + m % T).to(tl.int64) * CIN
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # one loop over (tap, channel block), so the compiler pipelines its loads across taps too (the
    # codec's 96 channels are 3 blocks a tap)
    blocks = tl.cdiv(CIN, BLOCK_K)
    for i in range(0, K * blocks):
        j = i // blocks
        c = (i - j * blocks) * BLOCK_K + kk
        if EVEN_K:
            a_ok = m_ok[:, None]
            w_ok = n_ok[None, :]
        else:
            a_ok = m_ok[:, None] & (c < CIN)[None, :]
            w_ok = (c < CIN)[:, None] & n_ok[None, :]
        a = tl.load(x_ptr + (first + j * DIL * CIN)[:, None] + c[None, :], mask=a_ok, other=0.0)
        w = tl.load(w_ptr + (j * CIN + c).to(tl.int64)[:, None] * COUT + n[None, :], mask=w_ok, other=0.0)
        acc = tl.dot(a, w, acc, input_precision=DOT_PRECISION)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    out = out_ptr + m.to(tl.int64)[:, None] * COUT + n[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


# the same over one channel per group (the codec's ConvNeXt convs): K products per output element, no
# dot; a tile of positions x channels, loads along the channels
@triton.jit(do_not_specialize=["M", "T", "L"])
def _depthwise_kernel(
    x_ptr,
    w_ptr,
    bias_ptr,
    out_ptr,
    M,
    T,
    L,
    C,
    DIL,
    K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    m_ok = m < M
    c_ok = c < C
    ok = m_ok[:, None] & c_ok[None, :]
    first = ((m // T) * L + m % T).to(tl.int64) * C
    acc = tl.zeros((BLOCK_M, BLOCK_C), dtype=tl.float32)
    for j in tl.static_range(K):
        x = tl.load(x_ptr + (first + j * DIL * C)[:, None] + c[None, :], mask=ok, other=0.0)
        w = tl.load(w_ptr + j * C + c, mask=c_ok, other=0.0)
        acc += x.to(tl.float32) * w.to(tl.float32)[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + c, mask=c_ok, other=0.0).to(tl.float32)[None, :]
    out = out_ptr + m.to(tl.int64)[:, None] * C + c[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=ok)


def stack_taps(weight: torch.Tensor) -> torch.Tensor:
    """A Conv1d's weight (Cout, Cin / groups, K) -> the (K Cin / groups, Cout) matrix ``conv1d_tm``
    takes: (K, C) for a depthwise conv."""
    cout, cin, k = weight.shape
    return weight.permute(2, 1, 0).reshape(k * cin, cout).contiguous()


def tiles(cin: int, cout: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K) for these channel widths: up to 128 output channels in one column
    tile (the codec's 96 in 128, its last conv's 1 in the 16 a dot needs: each input tile read
    once), more in tiles of 128 or 64 that divide them (192 in three of 64); the input channels in
    steps that divide them where 64 or 32 do."""
    if cout <= 128:
        block_n = max(MIN_DOT_DIM, triton.next_power_of_2(cout))
    else:
        block_n = 128 if cout % 128 == 0 or cout % 64 else 64
    block_k = 64 if cin % 64 == 0 else 32 if cin % 32 == 0 else min(64, max(MIN_DOT_DIM, triton.next_power_of_2(cin)))
    # 128 positions a tile: every program reads all K x Cin x BLOCK_N of its weights (from L2), so
    # more positions a tile read them fewer times; the last stages' millions of positions at 96
    # channels are where that counts
    block_m = 128
    if interpreter_enabled():  # the interpreter runs programs one after another: few, wide ones
        block_m = INTERPRETER_BLOCK_N
    return block_m, block_n, block_k


def conv1d_tm(
    xx: torch.Tensor,
    taps: torch.Tensor,
    kernel: int,
    dilation: int = 1,
    bias: torch.Tensor | None = None,
    depthwise: bool = False,
    tile: tuple[int, int, int] | None = None,
) -> torch.Tensor:
    """xx (B, L, Cin) contiguous, taps (K Cin, Cout) from ``stack_taps`` in xx's dtype ((K, C) for a
    ``depthwise`` conv, Cin = Cout = C groups), bias (Cout,) or None -> (B, L - (K - 1) dilation, Cout)
    contiguous in xx's dtype, float32 accumulation. ``tile``: (BLOCK_M, BLOCK_N, BLOCK_K) of a dense
    conv instead of ``tiles``' choice (benchmarks/conv_bench.py tries others)."""
    if xx.dim() != 3 or not xx.is_contiguous():
        raise ValueError(f"xx must be a contiguous (B, L, Cin), got {tuple(xx.shape)} strides {xx.stride()}")
    if xx.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"xx must be one of {SUPPORTED_DTYPES}, got {xx.dtype}")
    b, length, cin = xx.shape
    rows, cols = (kernel, cin) if depthwise else (kernel * cin, None)
    if (
        taps.dim() != 2
        or taps.shape[0] != rows
        or (cols is not None and taps.shape[1] != cols)
        or taps.dtype != xx.dtype
        or not taps.is_contiguous()
    ):
        raise ValueError(
            f"taps must be a contiguous ({rows}, {cols or 'Cout'}) {xx.dtype} matrix, got {taps.dtype} {tuple(taps.shape)}"
        )
    cout = taps.shape[1]
    if bias is not None and (bias.shape != (cout,) or not bias.is_contiguous()):
        raise ValueError(f"bias must be a contiguous ({cout},), got {tuple(bias.shape)}")
    t = length - (kernel - 1) * dilation
    if t < 0:
        raise ValueError(f"{length} input steps, fewer than the {(kernel - 1) * dilation} of the history")
    on_device = {"taps": taps} if bias is None else {"taps": taps, "bias": bias}
    check_same_device_unit_stride(on_device, xx.device)
    out = torch.empty(b, t, cout, device=xx.device, dtype=xx.dtype)
    if out.numel() == 0:
        return out
    bias_ptr = taps if bias is None else bias  # never read without a bias
    if depthwise:
        block_c = 64 if cout % 64 == 0 else 32 if cout % 32 == 0 else min(64, triton.next_power_of_2(cout))
        block_m = 4096 // block_c
        grid = (triton.cdiv(b * t, block_m), triton.cdiv(cout, block_c))
        _depthwise_kernel[grid](
            xx, taps, bias_ptr, out, b * t, t, length, cout, dilation,
            K=kernel, HAS_BIAS=bias is not None, BLOCK_M=block_m, BLOCK_C=block_c,
        )  # fmt: skip
        return out
    block_m, block_n, block_k = tile or tiles(cin, cout)
    grid = (triton.cdiv(b * t, block_m), triton.cdiv(cout, block_n))
    _conv_kernel[grid](
        xx,
        taps,
        bias_ptr,
        out,
        b * t,
        t,
        length,
        cin,
        cout,
        dilation,
        K=kernel,
        HAS_BIAS=bias is not None,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        EVEN_K=cin % block_k == 0,
        DOT_PRECISION="ieee" if xx.dtype == torch.float32 else "tf32",
        num_warps=8 if block_m * block_n >= 128 * 128 else 4,  # 128 x 128 fp32 accumulators: 64 a thread
        num_stages=3,
    )
    return out
