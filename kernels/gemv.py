"""fused_linear (kernels/fused_linear.py) for one or two rows: the B = 1 frame step's every linear.

The frame step at B = 1 is a chain of ~440 dependent linears, each launched with programmatic dependent
launch (kernels/pdl.py). The tiled kernel streams all its weights *after* its wait. This one, grid
cdiv(N, BLOCK_N) and no tl.dot, loads the first two K chunks of its weight band into registers *before*
the wait (weights are read-only), so they stream while the previous kernel finishes; after the wait it
reads x, multiplies and sums rows in fp32 registers while the next chunks arrive. Same prologues and
epilogues as the tiled kernel, rounded the same way. On the H200 this took the B = 1 frame step from
4.06 to 2.93 ms (docs/performance-history.md, the one-/two-row GEMV path).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

from voicewire.kernels.launch_checks import INTERPRETER_BLOCK_N, interpreter_enabled
from voicewire.kernels.linear_epilogue import epilogue
from voicewire.kernels.pdl import pdl_enter, prefetch_l2

# Rows at most this many take this kernel (B = 1: the talker's row, the predictor's pair pass and its
# single-row passes). A program owns a band of rows and walks K in chunks, two in flight, in registers.
# Bands and chunks measured on the H200 (benchmarks/gemv_bench.py, shape by shape inside PDL chains at
# B = 1; the sweeps are in docs/performance-history.md): the talker's matrices (both
# sides >= 2048) stream best in 4-row bands with 2048-wide chunks; the code predictor's in 8-row bands
# with 1024-wide chunks (4 warps when that chunk is the whole row), but its down projection (K = 3072)
# in 4-row bands holding the whole row; 16- and 32-row bands lost everywhere.
GEMV_MAX_ROWS = 2
WIDE_GEMV_SIDE = 2048


@dataclass(frozen=True)
class GemvConfig:
    """Band shape of a one- or two-row launch (``gemv_config`` picks it; tests and benchmarks may override)."""

    block_n: int
    block_k: int
    num_warps: int = 8


def gemv_config(n: int, k: int) -> GemvConfig:
    """The measured bands (above); the interpreter gets a few wide programs (it runs them one by one)."""
    if interpreter_enabled():
        return GemvConfig(min(INTERPRETER_BLOCK_N, triton.next_power_of_2(n)), triton.next_power_of_2(k), 4)
    k_pow2 = triton.next_power_of_2(k)
    if min(n, k) >= WIDE_GEMV_SIDE:
        return GemvConfig(4, min(k_pow2, 2048), 4)
    if k > 2048:
        return GemvConfig(min(4, triton.next_power_of_2(n)), min(k_pow2, 4096), 4)
    block_k = min(k_pow2, 1024)
    return GemvConfig(min(8, triton.next_power_of_2(n)), block_k, 4 if block_k >= k else 8)


@triton.jit
def _w_chunk(band, c: tl.constexpr, n_ok, rk, K, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):
    """K chunk c (columns [c * BLOCK_K, + BLOCK_K)) of a program's (BLOCK_N, K) weight band."""
    if EVEN_K:
        return tl.load(band + c * BLOCK_K, mask=n_ok[:, None], other=0.0)
    return tl.load(band + c * BLOCK_K, mask=n_ok[:, None] & (c * BLOCK_K + rk < K)[None, :], other=0.0)


@triton.jit
def _x_chunk(x_row, norm_ptr, rstd, k, K, HAS_NORM: tl.constexpr):
    """(1, BLOCK_K) columns k of one input row, normed and scaled as the unfused layer rounds, in fp32."""
    ok = k < K
    xk = tl.load(x_row + k, mask=ok, other=0.0)
    if HAS_NORM:
        g = tl.load(norm_ptr + k, mask=ok, other=0.0).to(tl.float32)
        xn = (xk.to(tl.float32) * rstd).to(xk.dtype)
        xk = (xn.to(tl.float32) * g).to(xk.dtype)
    return xk.to(tl.float32)


@triton.jit
def _rstd(x_row, K, eps, rk, BLOCK_K: tl.constexpr, CHUNKS: tl.constexpr):
    sum_sq = 0.0
    for c in tl.static_range(CHUNKS):
        k = c * BLOCK_K + rk
        xs = tl.load(x_row + k, mask=k < K, other=0.0).to(tl.float32)
        sum_sq += tl.sum(xs * xs)
    return tl.math.rsqrt(sum_sq / K + eps)


@triton.jit
def _gemv_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    norm_ptr,
    bias_ptr,
    res_ptr,
    index_ptr,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_om,
    stride_rm,
    eps,
    prefetch_elements,
    HAS_NORM: tl.constexpr,
    ACT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_RES: tl.constexpr,
    HAS_INDEX: tl.constexpr,
    TWO_ROWS: tl.constexpr,
    EVEN_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    CHUNKS: tl.constexpr,
    USE_PDL: tl.constexpr,
    PREFETCH: tl.constexpr,
    PREFETCH_PIECES: tl.constexpr,
):
    """fused_linear for one or two rows: the weight band's first two K chunks are loaded into registers
    *before* the PDL wait (weights are read-only), so they stream while the previous kernel finishes;
    after the wait only the input rows (a few KB, in L2) and the rest of the band remain. No tl.dot:
    products and row sums in fp32 registers, each chunk reused for both rows."""
    pid = tl.program_id(0)
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    n_ok = rn < N
    band = w_ptr + rn[:, None] * stride_wn + rk[None, :]  # chunk 0 of the band: (BLOCK_N, BLOCK_K)
    up = band + N * stride_wn  # ACT_SILU_MUL: the up rows of the same outputs
    w_a = _w_chunk(band, 0, n_ok, rk, K, BLOCK_K, EVEN_K)
    u_a = _w_chunk(up, 0, n_ok, rk, K, BLOCK_K, EVEN_K) if ACT == 2 else w_a
    w_b, u_b = w_a, u_a
    if CHUNKS > 1:
        w_b = _w_chunk(band, 1, n_ok, rk, K, BLOCK_K, EVEN_K)
        u_b = _w_chunk(up, 1, n_ok, rk, K, BLOCK_K, EVEN_K) if ACT == 2 else w_b
    if PREFETCH and CHUNKS > 2:  # the rest of the band toward L2 (the loads below find it there)
        start = pid * BLOCK_N * stride_wn
        count = tl.minimum(tl.minimum(BLOCK_N, N - pid * BLOCK_N) * stride_wn, prefetch_elements)
        prefetch_l2(w_ptr + start, count, PREFETCH_PIECES)
        if ACT == 2:
            prefetch_l2(w_ptr + N * stride_wn + start, count, PREFETCH_PIECES)
    bias = tl.load(bias_ptr + rn, mask=n_ok, other=0.0) if HAS_BIAS else 0.0
    pdl_enter(USE_PDL)

    if HAS_INDEX:  # row m of x is row index[m] of the table x_ptr (an embedding lookup)
        x0 = x_ptr + tl.load(index_ptr).to(tl.int64) * stride_xm
        x1 = x_ptr + tl.load(index_ptr + TWO_ROWS).to(tl.int64) * stride_xm
    else:
        x0 = x_ptr
        x1 = x_ptr + stride_xm
    rk2 = rk[None, :]
    rstd0, rstd1 = 1.0, 1.0
    if HAS_NORM:
        rstd0 = _rstd(x0, K, eps, rk2, BLOCK_K, CHUNKS)
        if TWO_ROWS:
            rstd1 = _rstd(x1, K, eps, rk2, BLOCK_K, CHUNKS)
    acc0 = tl.zeros([BLOCK_N], dtype=tl.float32)
    acc1, up0, up1 = acc0, acc0, acc0
    for c in tl.static_range(CHUNKS):
        w, wu = w_a.to(tl.float32), u_a.to(tl.float32)
        w_a, u_a = w_b, u_b
        if c + 2 < CHUNKS:  # keep two chunks in flight
            w_b = _w_chunk(band, c + 2, n_ok, rk, K, BLOCK_K, EVEN_K)
            u_b = _w_chunk(up, c + 2, n_ok, rk, K, BLOCK_K, EVEN_K) if ACT == 2 else w_b
        k = c * BLOCK_K + rk2
        xk = _x_chunk(x0, norm_ptr, rstd0, k, K, HAS_NORM)
        acc0 += tl.sum(w * xk, axis=1)
        if ACT == 2:
            up0 += tl.sum(wu * xk, axis=1)
        if TWO_ROWS:
            xk = _x_chunk(x1, norm_ptr, rstd1, k, K, HAS_NORM)
            acc1 += tl.sum(w * xk, axis=1)
            if ACT == 2:
                up1 += tl.sum(wu * xk, axis=1)

    epilogue(acc0, up0, bias, x_ptr, res_ptr + rn, out_ptr + rn, n_ok, ACT, HAS_BIAS, HAS_RES)
    if TWO_ROWS:
        res1, out1 = res_ptr + stride_rm + rn, out_ptr + stride_om + rn
        epilogue(acc1, up1, bias, x_ptr, res1, out1, n_ok, ACT, HAS_BIAS, HAS_RES)


def launch_gemv(
    tensors: tuple[torch.Tensor, ...],
    n: int,
    k: int,
    strides: tuple[int, int, int, int],
    eps: float,
    prefetch_elements: int,
    two_rows: bool,
    cfg: GemvConfig,
    flags: dict[str, Any],
) -> None:
    """Launch for fused_linear, which checked the arguments: ``tensors`` (x, W, out, norm, bias, residual,
    index) with x standing in for the absent ones, ``strides`` of x, W, out and the residual rows,
    ``flags`` the HAS_* / ACT / PREFETCH / PDL constexprs."""
    _gemv_kernel[(triton.cdiv(n, cfg.block_n),)](
        *tensors,
        n,
        k,
        *strides,
        eps,
        prefetch_elements,
        TWO_ROWS=two_rows,
        EVEN_K=k % cfg.block_k == 0,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        CHUNKS=triton.cdiv(k, cfg.block_k),
        PREFETCH_PIECES=32 * cfg.num_warps,
        num_warps=cfg.num_warps,
        num_stages=1,
        **flags,
    )


__all__ = ["GEMV_MAX_ROWS", "GemvConfig", "gemv_config", "launch_gemv"]
