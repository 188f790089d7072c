"""One whole code-predictor pass in one persistent launch: input projection, every decoder layer, the head.

The code predictor runs 15 dependent passes per frame, each a 5-layer decoder over one new token per
stream, and at a few streams every one of its ~33 kernels per pass is a 4-12 MB weight read that takes
~5 us however it is launched (benchmarks/results/fused_h200/linear_m1_m64.json). Here the pass is one
launch of one program per SM that runs all its phases with a grid barrier between them
(kernels/grid_sync.py), and each program loads its band of a phase's weights into registers one or two
phases before it needs them: weights never depend on the activations, so they stream from HBM while
the barriers and the other phases run. Measured on the H200 (benchmarks/grid_sync_probe.py, 8 MB
phases): 3.6 us per phase against 5.2 us for a chain of PDL-launched kernels and 4.7 us for the same
persistent kernel loading after the barrier.

    P0  x = in @ Wp^T + b  (or x = in)             in: rows of ``inputs``, or table rows at ``index``
    per layer l:
    A   qkv = rms_norm(x) @ Wqkv^T
    B   q, k = rope(norm(q)), rope(norm(k)); cache[l, stream, :, pos] <- k, v; a = attention(q, cache)
    C   x = x + a @ Wo^T
    D   g = silu(n @ Wg^T) * (n @ Wu^T), n = rms_norm(x)
    E   x = x + g @ Wd^T
    H   logits[stream] = rms_norm(x[last row of stream]) @ Whead^T     (float32)

A program owns a band of output rows of each matrix (cdiv(N, programs) rows) and every row of x;
phase B's items are (stream, KV head) pairs, each walking its stream's rows in position order, so the
first pass's two rows (positions 0 and 1) see each other's keys. Rounding follows the unfused layers
step by step, as kernels/fused_linear.py and kernels/qk_norm_rope.py do; the dot products sum in a
different order, so results match them to float rounding (tests/kernels/test_decoder_pass.py).

All programs must be resident at once: the grid is the SM count and each program takes a whole SM
(512 threads). In the CPU interpreter, which runs programs one after another, the grid is one program
that does every band, and the barriers drop out.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.grid_sync import grid_barrier, grid_exit
from kernels.launch_checks import (
    LOG2_E,
    SUPPORTED_DTYPES,
    check_same_device_unit_stride,
    interpreter_enabled,
)
from kernels.pdl import pdl_enter, pdl_launch, prefetch_l2
from kernels.qk_norm_rope import _rms_rope

# 16 warps: the weight bands in flight take up to ~150 KB of the SM's 256 KB register file (gate|up and
# down at the 1.7B shapes), which leaves each of 512 threads room for the rest of its 128 registers.
NUM_WARPS = 8
# How a program gets a phase's weight band ahead of the phase: "registers" (loaded into registers right
# after the phase before has done its own work) or "l2" (bulk-prefetched into L2 a layer ahead, loaded
# after the barrier). Measured in benchmarks/pass_bench.py.
STAGING = "registers"
# Bulk L2 prefetches per band ("l2" staging): each is one request to the SM's copy engine, which works
# through them one by one (256 per band, 1024 per layer, held up the barrier by ~5 us a layer).
PREFETCH_REQUESTS = tl.constexpr(8)


@functools.lru_cache(maxsize=8)
def _programs(device: torch.device) -> int:
    if interpreter_enabled() or device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count


def _split(n: int) -> tuple[int, int]:
    """n as a power of two plus a smaller power of two covering the rest (or 0): 24 -> (16, 8)."""
    first = 1 << (n.bit_length() - 1)
    rest = n - first
    return first, triton.next_power_of_2(rest) if rest else 0


@triton.jit
def _tile(w_ptr, n_rows, K, row0, rows_here, TR: tl.constexpr, K0: tl.constexpr, TK: tl.constexpr):
    """Rows [row0, row0 + rows_here) of the (n_rows, K) matrix at w_ptr, columns [K0, K0 + TK), as a
    (TR, TK) tile; rows and columns outside are 0 and are not read."""
    r = tl.arange(0, TR)
    k = K0 + tl.arange(0, TK)
    rows = row0 + r
    ok = ((r < rows_here) & (rows < n_rows))[:, None] & (k < K)[None, :]
    return tl.load(w_ptr + rows.to(tl.int64)[:, None] * K + k[None, :], mask=ok, other=0.0)


@triton.jit
def _row(x_ptr, K, K0: tl.constexpr, TK: tl.constexpr):
    """Columns [K0, K0 + TK) of a row other programs wrote (through L2: no stale L1 line)."""
    k = K0 + tl.arange(0, TK)
    return tl.load(x_ptr + k, mask=k < K, other=0.0, cache_modifier=".cg")


@triton.jit
def _vector(ptr, K, TK: tl.constexpr):
    """A read-only vector (a norm weight) as float32, zero past K."""
    k = tl.arange(0, TK)
    return tl.load(ptr + k, mask=k < K, other=0.0).to(tl.float32)


@triton.jit
def _normed(xs, g, K, eps):
    """rms_norm(row) * g, rounded to the row's dtype where the reference rounds (g: float32)."""
    xf = xs.to(tl.float32)
    rstd = tl.math.rsqrt(tl.sum(xf * xf, axis=0) / K + eps)
    return ((xf * rstd).to(xs.dtype).to(tl.float32) * g).to(xs.dtype)


@triton.jit
def _dot(w, xr):
    """(TR, TK) tile . (TK,) row -> (TR,) float32."""
    return tl.sum(w.to(tl.float32) * xr.to(tl.float32)[None, :], axis=1)


@triton.jit
def _store_band(out_ptr, row0, rows_here, n, y, TR: tl.constexpr):
    r = tl.arange(0, TR)
    tl.store(out_ptr + row0 + r, y.to(out_ptr.dtype.element_ty), mask=(r < rows_here) & (row0 + r < n))


@triton.jit
def _add(res, y):
    """res + y in the reference's rounding (y rounded to res's dtype first)."""
    return (res.to(tl.float32) + y.to(res.dtype).to(tl.float32)).to(res.dtype)


@triton.jit
def _sync(counter_ptr, barrier, SYNC: tl.constexpr):
    if SYNC:
        grid_barrier(counter_ptr, barrier * tl.num_programs(0))


@triton.jit
def _stamp(stamps_ptr, i, TIMING: tl.constexpr):
    """Program 0's SM clock at point i of the pass (benchmarks/pass_bench.py); compiled out when off."""
    if TIMING:  # noqa: SIM102 (a constexpr branch: compiled out when off)
        if tl.program_id(0) == 0:
            now = tl.inline_asm_elementwise(
                "mov.u64 $0, %clock64;", "=l,r", [tl.program_id(0)], dtype=tl.int64, is_pure=False, pack=1
            )
            tl.store(stamps_ptr + i, now)


@triton.jit
def _head_loads(row, g, Q_HEADS: tl.constexpr, KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Query heads of KV head g (G, D/2) x 2 halves, and its key and value halves, from a q|k|v row."""
    G: tl.constexpr = Q_HEADS // KV_HEADS
    half: tl.constexpr = HEAD_DIM // 2
    d = tl.arange(0, half)
    q = row + (g * G + tl.arange(0, G))[:, None] * HEAD_DIM + d[None, :]
    k = row + (Q_HEADS + g) * HEAD_DIM + d
    v = row + (Q_HEADS + KV_HEADS + g) * HEAD_DIM + d
    return (
        tl.load(q, cache_modifier=".cg"),
        tl.load(q + half, cache_modifier=".cg"),
        tl.load(k, cache_modifier=".cg"),
        tl.load(k + half, cache_modifier=".cg"),
        tl.load(v, cache_modifier=".cg"),
        tl.load(v + half, cache_modifier=".cg"),
    )


@triton.jit
def _attend_row(
    q1,
    q2,
    k1,
    k2,
    v1,
    v2,
    kc1,
    kc2,
    vc1,
    vc2,
    qn1,
    qn2,
    kn1,
    kn2,
    inv_freq,
    pos,
    eps,
    qk_scale_log2,
    k_dst,
    v_dst,
    out,
    HEAD_DIM: tl.constexpr,
    T: tl.constexpr,
):
    """One row's attention for one KV head: q/k norm + RoPE, its key and value into the cache (global,
    for later passes, and the register tiles kc / vc, for this pass), then softmax(q K^T) V over
    positions 0..pos. Returns the updated tiles."""
    half: tl.constexpr = HEAD_DIM // 2
    d = tl.arange(0, half)
    t = tl.arange(0, T)
    dtype = q1.dtype
    angle = pos * inv_freq
    cos = tl.cos(angle).to(dtype).to(tl.float32)
    sin = tl.sin(angle).to(dtype).to(tl.float32)
    # per-head RMS norm and RoPE of the G query heads (kernels/qk_norm_rope.py's rounding)
    f1, f2 = q1.to(tl.float32), q2.to(tl.float32)
    rstd = tl.math.rsqrt((tl.sum(f1 * f1, axis=1) + tl.sum(f2 * f2, axis=1)) / HEAD_DIM + eps)
    n1 = ((f1 * rstd[:, None]).to(dtype).to(tl.float32) * qn1[None, :]).to(dtype).to(tl.float32)
    n2 = ((f2 * rstd[:, None]).to(dtype).to(tl.float32) * qn2[None, :]).to(dtype).to(tl.float32)
    c, sn = cos[None, :], sin[None, :]
    r1 = ((n1 * c).to(dtype).to(tl.float32) + (-n2 * sn).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
    r2 = ((n2 * c).to(dtype).to(tl.float32) + (n1 * sn).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
    key1, key2 = _rms_rope(k1, k2, kn1, kn2, cos, sin, eps, HEAD_DIM)
    tl.store(k_dst + d, key1)
    tl.store(k_dst + half + d, key2)
    tl.store(v_dst + d, v1)
    tl.store(v_dst + half + d, v2)
    here = (t == pos)[:, None]
    kc1 = tl.where(here, key1[None, :], kc1)
    kc2 = tl.where(here, key2[None, :], kc2)
    vc1 = tl.where(here, v1[None, :], vc1)
    vc2 = tl.where(here, v2[None, :], vc2)
    valid = t <= pos
    scores = tl.sum(r1[:, None, :] * kc1.to(tl.float32)[None, :, :], axis=2)
    scores += tl.sum(r2[:, None, :] * kc2.to(tl.float32)[None, :, :], axis=2)  # (G, T)
    scores = tl.where(valid[None, :], scores * qk_scale_log2, float("-inf"))
    top = tl.max(scores, axis=1)
    p = tl.exp2(scores - top[:, None])
    total = tl.sum(p, axis=1)
    pr = p.to(dtype).to(tl.float32)  # the reference rounds p to the value dtype before p . V
    a1 = tl.sum(pr[:, :, None] * vc1.to(tl.float32)[None, :, :], axis=1) / total[:, None]
    a2 = tl.sum(pr[:, :, None] * vc2.to(tl.float32)[None, :, :], axis=1) / total[:, None]
    heads = tl.arange(0, q1.shape[0])
    tl.store(out + heads[:, None] * HEAD_DIM + d[None, :], a1.to(dtype))
    tl.store(out + heads[:, None] * HEAD_DIM + half + d[None, :], a2.to(dtype))
    return kc1, kc2, vc1, vc2


@triton.jit
def _attention_phase(
    qkv_ptr,
    attn_ptr,
    q_norm_ptr,
    k_norm_ptr,
    inv_freq_ptr,
    k_ptr,
    v_ptr,
    layer,
    pos0,
    eps,
    qk_scale_log2,
    NQKV: tl.constexpr,
    Q_HEADS: tl.constexpr,
    KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    T: tl.constexpr,
    RPS: tl.constexpr,
):
    """Items = KV heads. The cache positions of earlier passes and the rows' q|k|v are loaded at once
    (one round trip); the rows' own keys join the register tiles, so nothing waits on a cache write."""
    G: tl.constexpr = Q_HEADS // KV_HEADS
    half: tl.constexpr = HEAD_DIM // 2
    d = tl.arange(0, half)
    t = tl.arange(0, T)
    qn1 = tl.load(q_norm_ptr + d).to(tl.float32)
    qn2 = tl.load(q_norm_ptr + half + d).to(tl.float32)
    kn1 = tl.load(k_norm_ptr + d).to(tl.float32)
    kn2 = tl.load(k_norm_ptr + half + d).to(tl.float32)
    inv_freq = tl.load(inv_freq_ptr + d)
    for g in range(tl.program_id(0), KV_HEADS, tl.num_programs(0)):
        cache = tl.cast(layer * KV_HEADS + g, tl.int64) * (T * HEAD_DIM)
        earlier = (t < pos0)[:, None]
        tile = cache + t[:, None] * HEAD_DIM + d[None, :]
        kc1 = tl.load(k_ptr + tile, mask=earlier, other=0.0)
        kc2 = tl.load(k_ptr + tile + half, mask=earlier, other=0.0)
        vc1 = tl.load(v_ptr + tile, mask=earlier, other=0.0)
        vc2 = tl.load(v_ptr + tile + half, mask=earlier, other=0.0)
        q1, q2, k1, k2, v1, v2 = _head_loads(qkv_ptr, g, Q_HEADS, KV_HEADS, HEAD_DIM)
        if RPS == 2:
            q1b, q2b, k1b, k2b, v1b, v2b = _head_loads(qkv_ptr + NQKV, g, Q_HEADS, KV_HEADS, HEAD_DIM)
        dst = cache + pos0 * HEAD_DIM
        kc1, kc2, vc1, vc2 = _attend_row(
            q1,
            q2,
            k1,
            k2,
            v1,
            v2,
            kc1,
            kc2,
            vc1,
            vc2,
            qn1,
            qn2,
            kn1,
            kn2,
            inv_freq,
            pos0,
            eps,
            qk_scale_log2,
            k_ptr + dst,
            v_ptr + dst,
            attn_ptr + g * G * HEAD_DIM,
            HEAD_DIM,
            T,
        )
        if RPS == 2:
            _attend_row(
                q1b,
                q2b,
                k1b,
                k2b,
                v1b,
                v2b,
                kc1,
                kc2,
                vc1,
                vc2,
                qn1,
                qn2,
                kn1,
                kn2,
                inv_freq,
                pos0 + 1,
                eps,
                qk_scale_log2,
                k_ptr + dst + HEAD_DIM,
                v_ptr + dst + HEAD_DIM,
                attn_ptr + Q_HEADS * HEAD_DIM + g * G * HEAD_DIM,
                HEAD_DIM,
                T,
            )


@triton.jit
def _gate_up_tiles(gate, F, H, gu0, R_GU, GU1: tl.constexpr, GU2: tl.constexpr, TK_H: tl.constexpr):
    """This program's gate and up bands, each as one or two tiles (the second a copy when unused)."""
    wg1 = _tile(gate, F, H, gu0, R_GU, GU1, 0, TK_H)
    wu1 = _tile(gate + F * H, F, H, gu0, R_GU, GU1, 0, TK_H)
    wg2, wu2 = wg1, wu1
    if GU2 > 0:
        wg2 = _tile(gate, F, H, gu0 + GU1, R_GU - GU1, GU2, 0, TK_H)
        wu2 = _tile(gate + F * H, F, H, gu0 + GU1, R_GU - GU1, GU2, 0, TK_H)
    return wg1, wu1, wg2, wu2


@triton.jit
def _down_tiles(down, H, F, h0, R_H, TR_H: tl.constexpr, FK1: tl.constexpr, FK2: tl.constexpr):
    """This program's rows of the down projection, K in one or two tiles."""
    wd1 = _tile(down, H, F, h0, R_H, TR_H, 0, FK1)
    wd2 = wd1
    if FK2 > 0:
        wd2 = _tile(down, H, F, h0, R_H, TR_H, FK1, FK2)
    return wd1, wd2


@triton.jit
def _prefetch_band(w_ptr, n_rows, K, row0, rows_here, PIECES: tl.constexpr):
    """Start streaming rows [row0, row0 + rows_here) of an (n_rows, K) matrix into L2 (one range)."""
    count = tl.maximum(tl.minimum(rows_here, n_rows - row0), 0) * K
    prefetch_l2(w_ptr + tl.cast(row0, tl.int64) * K, count, PIECES, PREFETCH_REQUESTS)


@triton.jit
def _swiglu(wg1, wu1, wg2, wu2, xr, out_ptr, row0, rows_here, F, GU1: tl.constexpr, GU2: tl.constexpr):
    """silu(xr . Wg^T) * (xr . Wu^T) over this program's band (one or two tiles), stored."""
    dtype = out_ptr.dtype.element_ty
    gv = _dot(wg1, xr).to(dtype).to(tl.float32)
    sv = (gv / (1.0 + tl.exp(-gv))).to(dtype).to(tl.float32)
    _store_band(out_ptr, row0, rows_here, F, sv * _dot(wu1, xr).to(dtype).to(tl.float32), GU1)
    if GU2 > 0:
        gv2 = _dot(wg2, xr).to(dtype).to(tl.float32)
        sv2 = (gv2 / (1.0 + tl.exp(-gv2))).to(dtype).to(tl.float32)
        _store_band(
            out_ptr, row0 + GU1, rows_here - GU1, F, sv2 * _dot(wu2, xr).to(dtype).to(tl.float32), GU2
        )


@triton.jit
def _down(wd1, wd2, g_row, F, FK1: tl.constexpr, FK2: tl.constexpr):
    """g_row . Wd^T over this program's band, K in one or two tiles."""
    y = _dot(wd1, _row(g_row, F, 0, FK1))
    if FK2 > 0:
        y += _dot(wd2, _row(g_row, F, FK1, FK2))
    return y


@triton.jit
def _decoder_pass_kernel(
    in_ptr,
    index_ptr,
    proj_w_ptr,
    proj_b_ptr,
    ln1_ptr,
    qkv_w_ptr,
    q_norm_ptr,
    k_norm_ptr,
    o_w_ptr,
    ln2_ptr,
    gu_w_ptr,
    down_w_ptr,
    final_norm_ptr,
    head_w_ptr,
    inv_freq_ptr,
    k_ptr,
    v_ptr,
    x_ptr,
    qkv_ptr,
    attn_ptr,
    g_ptr,
    logits_ptr,
    counter_ptr,
    stamps_ptr,
    in_stride,
    pos0,
    n_layers,
    eps,
    qk_scale_log2,
    R_H,
    R_QKV,
    R_GU,
    R_HEAD,
    HT: tl.constexpr,
    H: tl.constexpr,
    F: tl.constexpr,
    V: tl.constexpr,
    Q_HEADS: tl.constexpr,
    KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    T: tl.constexpr,
    RPS: tl.constexpr,
    TK_HT: tl.constexpr,
    TK_H: tl.constexpr,
    TK_A: tl.constexpr,
    FK1: tl.constexpr,
    FK2: tl.constexpr,
    TR_H: tl.constexpr,
    TR_QKV: tl.constexpr,
    GU1: tl.constexpr,
    GU2: tl.constexpr,
    TR_HEAD: tl.constexpr,
    HAS_INDEX: tl.constexpr,
    HAS_PROJ: tl.constexpr,
    SYNC: tl.constexpr,
    EARLY_LOADS: tl.constexpr,
    L2_PREFETCH: tl.constexpr,
    PIECES: tl.constexpr,
    TIMING: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pid = tl.program_id(0)
    A: tl.constexpr = Q_HEADS * HEAD_DIM
    NQKV: tl.constexpr = (Q_HEADS + 2 * KV_HEADS) * HEAD_DIM
    h0, qkv0, gu0, head0 = pid * R_H, pid * R_QKV, pid * R_GU, pid * R_HEAD
    _stamp(stamps_ptr, 0, TIMING)
    # weights need nothing from the kernels before: their loads start before the PDL wait
    if HAS_PROJ:
        wp = _tile(proj_w_ptr, H, HT, h0, R_H, TR_H, 0, TK_HT)
    if EARLY_LOADS:
        wq = _tile(qkv_w_ptr, NQKV, H, qkv0, R_QKV, TR_QKV, 0, TK_H)
    if L2_PREFETCH:
        _prefetch_band(qkv_w_ptr, NQKV, H, qkv0, R_QKV, PIECES)
    pdl_enter(USE_PDL)
    _stamp(stamps_ptr, 1, TIMING)

    # P0: the input rows projected to the predictor's width; each program keeps its band of x (the
    # residual stream) in registers, xa for row 0 and xb for row 1 (RPS == 2)
    r = tl.arange(0, TR_H)
    band_ok = (r < R_H) & (h0 + r < H)
    if HAS_INDEX:  # noqa: SIM108 (a constexpr branch)
        src = in_ptr + tl.load(index_ptr).to(tl.int64) * in_stride
    else:
        src = in_ptr
    if HAS_PROJ:
        bias = tl.load(proj_b_ptr + h0 + r, mask=band_ok, other=0.0).to(tl.float32)
        xa = (_dot(wp, _row(src, HT, 0, TK_HT)) + bias).to(x_ptr.dtype.element_ty)
        xb = xa
        if RPS == 2:
            xb = (_dot(wp, _row(src + in_stride, HT, 0, TK_HT)) + bias).to(x_ptr.dtype.element_ty)
    else:
        xa = tl.load(src + h0 + r, mask=band_ok, other=0.0)
        xb = xa
        if RPS == 2:
            xb = tl.load(src + in_stride + h0 + r, mask=band_ok, other=0.0)
    _store_band(x_ptr, h0, R_H, H, xa, TR_H)
    if RPS == 2:
        _store_band(x_ptr + H, h0, R_H, H, xb, TR_H)
    _stamp(stamps_ptr, 2, TIMING)

    for layer in range(n_layers):
        barrier = 1 + 5 * layer  # P0's, then five per layer
        lw = tl.cast(layer, tl.int64)
        o_w, gate, down = o_w_ptr + lw * H * A, gu_w_ptr + lw * 2 * F * H, down_w_ptr + lw * H * F
        if L2_PREFETCH:  # this layer's o, gate|up and down bands start streaming into L2
            _prefetch_band(o_w, H, A, h0, R_H, PIECES)
            _prefetch_band(gate, F, H, gu0, R_GU, PIECES)
            _prefetch_band(gate + F * H, F, H, gu0, R_GU, PIECES)
            _prefetch_band(down, H, F, h0, R_H, PIECES)
        g1 = _vector(ln1_ptr + lw * H, H, TK_H)
        _sync(counter_ptr, barrier, SYNC)
        _stamp(stamps_ptr, 3 + 10 * layer, TIMING)
        # A: q|k|v
        ra = _row(x_ptr, H, 0, TK_H)
        rb = ra
        if RPS == 2:
            rb = _row(x_ptr + H, H, 0, TK_H)
        if not EARLY_LOADS:
            wq = _tile(qkv_w_ptr + lw * NQKV * H, NQKV, H, qkv0, R_QKV, TR_QKV, 0, TK_H)
        _store_band(qkv_ptr, qkv0, R_QKV, NQKV, _dot(wq, _normed(ra, g1, H, eps)), TR_QKV)
        if RPS == 2:
            _store_band(qkv_ptr + NQKV, qkv0, R_QKV, NQKV, _dot(wq, _normed(rb, g1, H, eps)), TR_QKV)
        if EARLY_LOADS:  # the o band, used two phases on
            wo = _tile(o_w, H, A, h0, R_H, TR_H, 0, TK_A)
        _stamp(stamps_ptr, 4 + 10 * layer, TIMING)
        _sync(counter_ptr, barrier + 1, SYNC)
        _stamp(stamps_ptr, 5 + 10 * layer, TIMING)
        # B: attention
        _attention_phase(
            qkv_ptr,
            attn_ptr,
            q_norm_ptr + lw * HEAD_DIM,
            k_norm_ptr + lw * HEAD_DIM,
            inv_freq_ptr,
            k_ptr,
            v_ptr,
            layer,
            pos0,
            eps,
            qk_scale_log2,
            NQKV,
            Q_HEADS,
            KV_HEADS,
            HEAD_DIM,
            T,
            RPS,
        )
        if EARLY_LOADS:  # the gate|up bands, used two phases on
            wg1, wu1, wg2, wu2 = _gate_up_tiles(gate, F, H, gu0, R_GU, GU1, GU2, TK_H)
        _stamp(stamps_ptr, 6 + 10 * layer, TIMING)
        _sync(counter_ptr, barrier + 2, SYNC)
        _stamp(stamps_ptr, 7 + 10 * layer, TIMING)
        # C: x += a @ Wo^T
        aa = _row(attn_ptr, A, 0, TK_A)
        ab = aa
        if RPS == 2:
            ab = _row(attn_ptr + A, A, 0, TK_A)
        if not EARLY_LOADS:
            wo = _tile(o_w, H, A, h0, R_H, TR_H, 0, TK_A)
        xa = _add(xa, _dot(wo, aa))
        _store_band(x_ptr, h0, R_H, H, xa, TR_H)
        if RPS == 2:
            xb = _add(xb, _dot(wo, ab))
            _store_band(x_ptr + H, h0, R_H, H, xb, TR_H)
        g2 = _vector(ln2_ptr + lw * H, H, TK_H)
        _stamp(stamps_ptr, 8 + 10 * layer, TIMING)
        _sync(counter_ptr, barrier + 3, SYNC)
        _stamp(stamps_ptr, 9 + 10 * layer, TIMING)
        # D: SwiGLU of the normed x
        more = tl.cast(layer + 1 < n_layers, tl.int32)  # past the last layer nothing is read
        if L2_PREFETCH:  # the next layer's q|k|v band (or the head's)
            _prefetch_band(qkv_w_ptr + (lw + 1) * NQKV * H, NQKV, H, qkv0, R_QKV * more, PIECES)
            _prefetch_band(head_w_ptr, V, H, head0, R_HEAD * (1 - more), PIECES)
        ra = _row(x_ptr, H, 0, TK_H)
        rb = ra
        if RPS == 2:
            rb = _row(x_ptr + H, H, 0, TK_H)
        if not EARLY_LOADS:
            wg1, wu1, wg2, wu2 = _gate_up_tiles(gate, F, H, gu0, R_GU, GU1, GU2, TK_H)
        _swiglu(wg1, wu1, wg2, wu2, _normed(ra, g2, H, eps), g_ptr, gu0, R_GU, F, GU1, GU2)
        if RPS == 2:
            _swiglu(wg1, wu1, wg2, wu2, _normed(rb, g2, H, eps), g_ptr + F, gu0, R_GU, F, GU1, GU2)
        if EARLY_LOADS:  # the down band and the next layer's q|k|v band
            wd1, wd2 = _down_tiles(down, H, F, h0, R_H, TR_H, FK1, FK2)
            wq = _tile(qkv_w_ptr + (lw + 1) * NQKV * H, NQKV, H, qkv0, R_QKV * more, TR_QKV, 0, TK_H)
        _stamp(stamps_ptr, 10 + 10 * layer, TIMING)
        _sync(counter_ptr, barrier + 4, SYNC)
        _stamp(stamps_ptr, 11 + 10 * layer, TIMING)
        # E: x += g @ Wd^T
        if not EARLY_LOADS:
            wd1, wd2 = _down_tiles(down, H, F, h0, R_H, TR_H, FK1, FK2)
        xa = _add(xa, _down(wd1, wd2, g_ptr, F, FK1, FK2))
        _store_band(x_ptr, h0, R_H, H, xa, TR_H)
        if RPS == 2:
            xb = _add(xb, _down(wd1, wd2, g_ptr + F, F, FK1, FK2))
            _store_band(x_ptr + H, h0, R_H, H, xb, TR_H)
        _stamp(stamps_ptr, 12 + 10 * layer, TIMING)

    # H: the head over the stream's last row
    wh = _tile(head_w_ptr, V, H, head0, R_HEAD, TR_HEAD, 0, TK_H)
    gf = _vector(final_norm_ptr, H, TK_H)
    _sync(counter_ptr, 1 + 5 * n_layers, SYNC)
    _stamp(stamps_ptr, 3 + 10 * n_layers, TIMING)
    xr = _normed(_row(x_ptr + (RPS - 1) * H, H, 0, TK_H), gf, H, eps)
    y = _dot(wh, xr).to(x_ptr.dtype.element_ty).to(tl.float32)
    _store_band(logits_ptr, head0, R_HEAD, V, y, TR_HEAD)
    _stamp(stamps_ptr, 4 + 10 * n_layers, TIMING)
    if SYNC:
        grid_exit(counter_ptr, counter_ptr + 1, tl.num_programs(0))


@dataclass(frozen=True)
class PassWeights:
    """The code predictor's weights as the pass kernel takes them: per-layer tensors stacked (L, ...)."""

    ln1: torch.Tensor  # (L, H)
    qkv: torch.Tensor  # (L, (Hq + 2 Hkv) D, H)
    q_norm: torch.Tensor  # (L, D)
    k_norm: torch.Tensor  # (L, D)
    o: torch.Tensor  # (L, H, Hq D)
    ln2: torch.Tensor  # (L, H)
    gate_up: torch.Tensor  # (L, 2F, H): gate rows then up rows
    down: torch.Tensor  # (L, H, F)
    final_norm: torch.Tensor  # (H,)
    proj: torch.Tensor | None  # (H, H_in): the input projection, or None when the widths match
    proj_bias: torch.Tensor | None  # (H,)
    inv_freq: torch.Tensor  # (D / 2,) float32
    q_heads: int
    eps: float

    def check(self) -> None:
        n_layers, hidden = self.ln1.shape
        width, head_dim = self.qkv.shape[1], self.q_norm.shape[1]
        kv_heads = (width // head_dim - self.q_heads) // 2
        ffn = self.down.shape[2]
        shapes = {
            "qkv": (n_layers, (self.q_heads + 2 * kv_heads) * head_dim, hidden),
            "k_norm": (n_layers, head_dim),
            "o": (n_layers, hidden, self.q_heads * head_dim),
            "ln2": (n_layers, hidden),
            "gate_up": (n_layers, 2 * ffn, hidden),
            "final_norm": (hidden,),
            "inv_freq": (head_dim // 2,),
        }
        for name, shape in shapes.items():
            if tuple(getattr(self, name).shape) != shape:
                raise ValueError(f"{name} must be {shape}, got {tuple(getattr(self, name).shape)}")
        if kv_heads < 1 or self.q_heads % kv_heads or head_dim & (head_dim - 1):
            raise ValueError(f"{self.q_heads} query heads, {kv_heads} KV heads of {head_dim} dims")
        if self.proj is not None and (
            self.proj.shape[0] != hidden or self.proj_bias is None or self.proj_bias.shape != (hidden,)
        ):
            raise ValueError(f"proj must be ({hidden}, H_in) with a ({hidden},) bias")


def decoder_pass(
    inputs: torch.Tensor,
    weights: PassWeights,
    head: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    counter: torch.Tensor,
    *,
    pos0: int,
    index: torch.Tensor | None = None,
    pdl: bool = False,
    stamps: torch.Tensor | None = None,
    staging: str = STAGING,
) -> torch.Tensor:
    """One code-predictor pass of one stream -> logits (1, V) float32 of its last row.

    inputs (R, H_in), R = 1 or 2 rows at positions pos0, pos0 + 1 (the first pass: the talker's hidden
    state and codebook 0's embedding); or, with ``index`` (1,) int32 / int64, a table (vocab, H_in)
    whose row ``index[0]`` is the one input row. head (V, H); caches (L, 1, Hkv, T, D), T a power of
    two: each row attends to positions 0..its own of the stream (earlier passes wrote the ones before
    pos0). counter: (2,) int32 zeros, the grid barrier's, owned by the caller and left zeroed; launches
    sharing it must not overlap. stamps: (64,) int64, program 0's SM clock at each phase boundary
    (benchmarks/pass_bench.py), CUDA only.
    """
    w = weights
    w.check()
    n_layers, hidden = w.ln1.shape
    head_dim = w.q_norm.shape[1]
    kv_heads = (w.qkv.shape[1] // head_dim - w.q_heads) // 2
    ffn, vocab, h_in = w.down.shape[2], head.shape[0], inputs.shape[1]
    if index is not None:
        if index.shape != (1,) or index.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"index must be (1,) int32 or int64, got {index.dtype} {tuple(index.shape)}")
        rows = 1
    else:
        rows = inputs.shape[0]
        if rows not in (1, 2):
            raise ValueError(f"a pass takes 1 or 2 input rows, got {rows}")
    positions = k_cache.shape[3]
    cache_shape = (n_layers, 1, kv_heads, positions, head_dim)
    if tuple(k_cache.shape) != cache_shape or v_cache.shape != k_cache.shape:
        raise ValueError(f"caches must be {cache_shape}, got {tuple(k_cache.shape)}, {tuple(v_cache.shape)}")
    if positions & (positions - 1) or not 0 <= pos0 <= positions - rows:
        raise ValueError(
            f"positions {pos0}..{pos0 + rows - 1} outside the cache's {positions} (a power of 2)"
        )
    if head.shape != (vocab, hidden) or (w.proj is None and h_in != hidden):
        raise ValueError(f"head must be (V, {hidden}) and inputs {hidden} wide without a projection")
    if w.proj is not None and w.proj.shape[1] != h_in:
        raise ValueError(f"inputs are {h_in} wide, the projection takes {w.proj.shape[1]}")
    if counter.dtype != torch.int32 or counter.shape != (2,):
        raise TypeError("counter must be (2,) int32")
    if staging not in ("registers", "l2"):
        raise ValueError(f"staging must be 'registers' or 'l2', got {staging!r}")
    dtype = inputs.dtype
    stacked = (w.ln1, w.qkv, w.q_norm, w.k_norm, w.o, w.ln2, w.gate_up, w.down, w.final_norm, head, k_cache)
    if dtype not in SUPPORTED_DTYPES or any(t.dtype != dtype for t in (*stacked, v_cache)):
        raise TypeError(f"inputs, weights and caches must share one of {SUPPORTED_DTYPES}")
    tensors = {f"t{i}": t for i, t in enumerate(stacked)}
    tensors |= {"inputs": inputs, "v_cache": v_cache, "inv_freq": w.inv_freq, "counter": counter}
    for name, t in tensors.items():
        if name != "inputs" and not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
    check_same_device_unit_stride(tensors, inputs.device)

    dev, q_width = inputs.device, w.q_heads * head_dim
    x = torch.empty((rows, hidden), device=dev, dtype=dtype)
    qkv = torch.empty((rows, w.qkv.shape[1]), device=dev, dtype=dtype)
    attn = torch.empty((rows, q_width), device=dev, dtype=dtype)
    g = torch.empty((rows, ffn), device=dev, dtype=dtype)
    logits = torch.empty((1, vocab), device=dev, dtype=torch.float32)
    programs = _programs(dev)

    def band(n: int) -> int:
        return triton.cdiv(n, programs)

    r_gu = band(ffn)
    gu1, gu2 = _split(r_gu)
    fk1, fk2 = _split(ffn)
    pow2 = triton.next_power_of_2
    _decoder_pass_kernel[(programs,)](
        inputs,
        index if index is not None else inputs,
        w.proj if w.proj is not None else inputs,
        w.proj_bias if w.proj_bias is not None else inputs,
        w.ln1,
        w.qkv,
        w.q_norm,
        w.k_norm,
        w.o,
        w.ln2,
        w.gate_up,
        w.down,
        w.final_norm,
        head,
        w.inv_freq,
        k_cache,
        v_cache,
        x,
        qkv,
        attn,
        g,
        logits,
        counter,
        stamps if stamps is not None else counter,
        inputs.stride(0),
        pos0,
        n_layers,
        w.eps,
        head_dim**-0.5 * LOG2_E,
        band(hidden),
        band(w.qkv.shape[1]),
        r_gu,
        band(vocab),
        HT=h_in,
        H=hidden,
        F=ffn,
        V=vocab,
        Q_HEADS=w.q_heads,
        KV_HEADS=kv_heads,
        HEAD_DIM=head_dim,
        T=positions,
        RPS=rows,
        TK_HT=pow2(h_in),
        TK_H=pow2(hidden),
        TK_A=pow2(q_width),
        FK1=fk1,
        FK2=fk2,
        TR_H=pow2(band(hidden)),
        TR_QKV=pow2(band(w.qkv.shape[1])),
        GU1=gu1,
        GU2=gu2,
        TR_HEAD=pow2(band(vocab)),
        HAS_INDEX=index is not None,
        HAS_PROJ=w.proj is not None,
        SYNC=programs > 1,
        EARLY_LOADS=staging == "registers",
        L2_PREFETCH=staging == "l2" and programs > 1,
        PIECES=32 * NUM_WARPS,
        TIMING=stamps is not None,
        num_warps=NUM_WARPS,
        num_stages=1,
        **pdl_launch(pdl, dev),
    )
    return logits


__all__ = ["PassWeights", "decoder_pass"]
