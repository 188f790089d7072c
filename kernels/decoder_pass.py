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
import os
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
from kernels.pdl import pdl_enter, pdl_launch
from kernels.qk_norm_rope import _rms_rope

# 16 warps: the weight bands in flight take up to ~150 KB of the SM's 256 KB register file (gate|up and
# down at the 1.7B shapes), which leaves each of 512 threads room for the rest of its 128 registers.
NUM_WARPS = int(os.environ.get("VOICEWIRE_PASS_WARPS", "16"))  # (measuring)


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
    """Columns [K0, K0 + TK) of a row another program wrote (through L2)."""
    k = K0 + tl.arange(0, TK)
    return tl.load(x_ptr + k, mask=k < K, other=0.0, cache_modifier=".cg")


@triton.jit
def _normed_row(x_ptr, norm_ptr, K, eps, TK: tl.constexpr):
    """rms_norm(row) * g, rounded to the row's dtype as the reference rounds it."""
    k = tl.arange(0, TK)
    ok = k < K
    xs = tl.load(x_ptr + k, mask=ok, other=0.0, cache_modifier=".cg")
    xf = xs.to(tl.float32)
    rstd = tl.math.rsqrt(tl.sum(xf * xf, axis=0) / K + eps)
    g = tl.load(norm_ptr + k, mask=ok, other=0.0).to(tl.float32)
    xn = (xf * rstd).to(xs.dtype).to(tl.float32)
    return (xn * g).to(xs.dtype)


@triton.jit
def _dot(w, xr):
    """(TR, TK) tile . (TK,) row -> (TR,) float32 (the row stays in its own dtype until here: half the
    registers of a float32 copy in every layout a tile asks for)."""
    return tl.sum(w.to(tl.float32) * xr.to(tl.float32)[None, :], axis=1)


@triton.jit
def _store_band(out_ptr, row0, rows_here, n, y, TR: tl.constexpr):
    r = tl.arange(0, TR)
    tl.store(out_ptr + row0 + r, y.to(out_ptr.dtype.element_ty), mask=(r < rows_here) & (row0 + r < n))


@triton.jit
def _residual_band(x_ptr, row0, rows_here, n, y, TR: tl.constexpr):
    """x[band] = x[band] + y, y rounded first (the band is this program's own: no other program reads
    it in this phase)."""
    r = tl.arange(0, TR)
    ok = (r < rows_here) & (row0 + r < n)
    res = tl.load(x_ptr + row0 + r, mask=ok, other=0.0)
    y = y.to(res.dtype).to(tl.float32)
    tl.store(x_ptr + row0 + r, (res.to(tl.float32) + y).to(res.dtype), mask=ok)


@triton.jit
def _sync(counter_ptr, barrier, SYNC: tl.constexpr):
    if SYNC:
        grid_barrier(counter_ptr, barrier * tl.num_programs(0))


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
    streams,
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
    """Items (stream, KV head): its rows' q/k norm + RoPE, the K/V cache write, and attention."""
    pid = tl.program_id(0)
    G: tl.constexpr = Q_HEADS // KV_HEADS
    half: tl.constexpr = HEAD_DIM // 2
    d = tl.arange(0, half)
    j = tl.arange(0, G)
    t = tl.arange(0, T)
    qn1 = tl.load(q_norm_ptr + d).to(tl.float32)
    qn2 = tl.load(q_norm_ptr + half + d).to(tl.float32)
    kn1 = tl.load(k_norm_ptr + d).to(tl.float32)
    kn2 = tl.load(k_norm_ptr + half + d).to(tl.float32)
    inv_freq = tl.load(inv_freq_ptr + d)
    dtype = qkv_ptr.dtype.element_ty
    for item in range(pid, streams * KV_HEADS, tl.num_programs(0)):
        s = item // KV_HEADS
        g = item % KV_HEADS
        cache = tl.cast((layer * streams + s) * KV_HEADS + g, tl.int64) * (T * HEAD_DIM)
        for r in tl.static_range(RPS):
            m = s * RPS + r
            pos = pos0 + r
            angle = pos * inv_freq
            cos = tl.cos(angle).to(dtype).to(tl.float32)
            sin = tl.sin(angle).to(dtype).to(tl.float32)
            row = qkv_ptr + m * NQKV
            heads = g * G + j
            q1 = tl.load(row + heads[:, None] * HEAD_DIM + d[None, :], cache_modifier=".cg").to(tl.float32)
            q2 = tl.load(row + heads[:, None] * HEAD_DIM + half + d[None, :], cache_modifier=".cg")
            q2 = q2.to(tl.float32)
            # per-head RMS norm and RoPE of the G query heads (kernels/qk_norm_rope.py's rounding)
            rstd = tl.math.rsqrt((tl.sum(q1 * q1, axis=1) + tl.sum(q2 * q2, axis=1)) / HEAD_DIM + eps)
            n1 = ((q1 * rstd[:, None]).to(dtype).to(tl.float32) * qn1[None, :]).to(dtype).to(tl.float32)
            n2 = ((q2 * rstd[:, None]).to(dtype).to(tl.float32) * qn2[None, :]).to(dtype).to(tl.float32)
            c, sn = cos[None, :], sin[None, :]
            o1 = (n1 * c).to(dtype).to(tl.float32) + (-n2 * sn).to(dtype).to(tl.float32)
            o2 = (n2 * c).to(dtype).to(tl.float32) + (n1 * sn).to(dtype).to(tl.float32)
            q1 = o1.to(dtype).to(tl.float32)
            q2 = o2.to(dtype).to(tl.float32)
            k_row = row + (Q_HEADS + g) * HEAD_DIM
            k1, k2 = _rms_rope(
                tl.load(k_row + d, cache_modifier=".cg"),
                tl.load(k_row + half + d, cache_modifier=".cg"),
                kn1,
                kn2,
                cos,
                sin,
                eps,
                HEAD_DIM,
            )
            v_row = row + (Q_HEADS + KV_HEADS + g) * HEAD_DIM
            dst = cache + pos * HEAD_DIM
            tl.store(k_ptr + dst + d, k1)
            tl.store(k_ptr + dst + half + d, k2)
            tl.store(v_ptr + dst + d, tl.load(v_row + d, cache_modifier=".cg"))
            tl.store(v_ptr + dst + half + d, tl.load(v_row + half + d, cache_modifier=".cg"))
            tl.debug_barrier()  # this program's key and value are in the cache before it reads it back
            valid = t <= pos
            kv_off = cache + t[:, None] * HEAD_DIM + d[None, :]
            kk1 = tl.load(k_ptr + kv_off, mask=valid[:, None], other=0.0, cache_modifier=".cg").to(tl.float32)
            kk2 = tl.load(k_ptr + kv_off + half, mask=valid[:, None], other=0.0, cache_modifier=".cg")
            scores = tl.sum(q1[:, None, :] * kk1[None, :, :], axis=2)
            scores += tl.sum(q2[:, None, :] * kk2.to(tl.float32)[None, :, :], axis=2)  # (G, T)
            scores = tl.where(valid[None, :], scores * qk_scale_log2, float("-inf"))
            top = tl.max(scores, axis=1)
            p = tl.exp2(scores - top[:, None])
            total = tl.sum(p, axis=1)
            pr = p.to(dtype).to(tl.float32)  # the reference rounds p to the value dtype before p . V
            vv1 = tl.load(v_ptr + kv_off, mask=valid[:, None], other=0.0, cache_modifier=".cg").to(tl.float32)
            vv2 = tl.load(v_ptr + kv_off + half, mask=valid[:, None], other=0.0, cache_modifier=".cg")
            a1 = tl.sum(pr[:, :, None] * vv1[None, :, :], axis=1) / total[:, None]
            a2 = tl.sum(pr[:, :, None] * vv2.to(tl.float32)[None, :, :], axis=1) / total[:, None]
            out = attn_ptr + m * (Q_HEADS * HEAD_DIM) + heads[:, None] * HEAD_DIM + d[None, :]
            tl.store(out, a1.to(dtype))
            tl.store(out + half, a2.to(dtype))
            tl.debug_barrier()  # (the next row of the stream reads this row's key)


@triton.jit
def _decoder_pass_kernel(
    in_ptr,
    index_ptr,
    in_stride,
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
    streams,
    pos0,
    n_layers,
    eps,
    qk_scale_log2,
    R_IN,
    R_QKV,
    R_O,
    R_GU,
    R_DOWN,
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
    TR_IN: tl.constexpr,
    TR_QKV: tl.constexpr,
    TR_O: tl.constexpr,
    GU1: tl.constexpr,
    GU2: tl.constexpr,
    TR_DOWN: tl.constexpr,
    TR_HEAD: tl.constexpr,
    HAS_INDEX: tl.constexpr,
    HAS_PROJ: tl.constexpr,
    SYNC: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pid = tl.program_id(0)
    A: tl.constexpr = Q_HEADS * HEAD_DIM
    NQKV: tl.constexpr = (Q_HEADS + 2 * KV_HEADS) * HEAD_DIM
    rows = streams * RPS
    in0, qkv0, o0 = pid * R_IN, pid * R_QKV, pid * R_O
    gu0, down0, head0 = pid * R_GU, pid * R_DOWN, pid * R_HEAD
    # weights need nothing from the kernels before: their loads start before the PDL wait
    if HAS_PROJ:
        wp = _tile(proj_w_ptr, H, HT, in0, R_IN, TR_IN, 0, TK_HT)
    wq = _tile(qkv_w_ptr, NQKV, H, qkv0, R_QKV, TR_QKV, 0, TK_H)
    pdl_enter(USE_PDL)

    # P0: the pass's input rows, projected to the predictor's width
    for m in range(rows):
        if HAS_INDEX:
            src = in_ptr + tl.load(index_ptr + m).to(tl.int64) * in_stride
        else:
            src = in_ptr + m * in_stride
        if HAS_PROJ:
            y = _dot(wp, _row(src, HT, 0, TK_HT))
            r = tl.arange(0, TR_IN)
            y += tl.load(proj_b_ptr + in0 + r, mask=(r < R_IN) & (in0 + r < H), other=0.0).to(tl.float32)
            _store_band(x_ptr + m * H, in0, R_IN, H, y, TR_IN)
        else:
            r = tl.arange(0, TR_IN)
            ok = (r < R_IN) & (in0 + r < H)
            tl.store(x_ptr + m * H + in0 + r, tl.load(src + in0 + r, mask=ok), mask=ok)

    for layer in range(n_layers):
        barrier = 1 + 5 * layer  # P0's, then five per layer
        _sync(counter_ptr, barrier, SYNC)
        lw = tl.cast(layer, tl.int64)
        # A: q|k|v (the o band starts loading: it is used two phases on)
        wo = _tile(o_w_ptr + lw * H * A, H, A, o0, R_O, TR_O, 0, TK_A)
        for m in range(rows):
            xr = _normed_row(x_ptr + m * H, ln1_ptr + lw * H, H, eps, TK_H)
            _store_band(qkv_ptr + m * NQKV, qkv0, R_QKV, NQKV, _dot(wq, xr), TR_QKV)
        _sync(counter_ptr, barrier + 1, SYNC)
        # B: attention (the gate|up bands start loading)
        _attention_phase(
            qkv_ptr,
            attn_ptr,
            q_norm_ptr + lw * HEAD_DIM,
            k_norm_ptr + lw * HEAD_DIM,
            inv_freq_ptr,
            k_ptr,
            v_ptr,
            layer,
            streams,
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
        _sync(counter_ptr, barrier + 2, SYNC)
        # C: x += a @ Wo^T
        gate = gu_w_ptr + lw * 2 * F * H
        wg1 = _tile(gate, F, H, gu0, R_GU, GU1, 0, TK_H)
        wu1 = _tile(gate + F * H, F, H, gu0, R_GU, GU1, 0, TK_H)
        if GU2 > 0:
            wg2 = _tile(gate, F, H, gu0 + GU1, R_GU - GU1, GU2, 0, TK_H)
            wu2 = _tile(gate + F * H, F, H, gu0 + GU1, R_GU - GU1, GU2, 0, TK_H)
        # C: x += a @ Wo^T
        for m in range(rows):
            _residual_band(x_ptr + m * H, o0, R_O, H, _dot(wo, _row(attn_ptr + m * A, A, 0, TK_A)), TR_O)
        _sync(counter_ptr, barrier + 3, SYNC)
        # D: SwiGLU of the normed x, then the next layer's q|k|v band starts loading
        for m in range(rows):
            xr = _normed_row(x_ptr + m * H, ln2_ptr + lw * H, H, eps, TK_H)
            gv = _dot(wg1, xr).to(g_ptr.dtype.element_ty).to(tl.float32)
            uv = _dot(wu1, xr).to(g_ptr.dtype.element_ty).to(tl.float32)
            sv = (gv / (1.0 + tl.exp(-gv))).to(g_ptr.dtype.element_ty).to(tl.float32)
            _store_band(g_ptr + m * F, gu0, R_GU, F, sv * uv, GU1)
            if GU2 > 0:
                gv2 = _dot(wg2, xr).to(g_ptr.dtype.element_ty).to(tl.float32)
                uv2 = _dot(wu2, xr).to(g_ptr.dtype.element_ty).to(tl.float32)
                sv2 = (gv2 / (1.0 + tl.exp(-gv2))).to(g_ptr.dtype.element_ty).to(tl.float32)
                _store_band(g_ptr + m * F, gu0 + GU1, R_GU - GU1, F, sv2 * uv2, GU2)
        down = down_w_ptr + lw * H * F
        wd1 = _tile(down, H, F, down0, R_DOWN, TR_DOWN, 0, FK1)
        if FK2 > 0:
            wd2 = _tile(down, H, F, down0, R_DOWN, TR_DOWN, FK1, FK2)
        more = tl.cast(layer + 1 < n_layers, tl.int32)  # past the last layer the load reads nothing
        wq = _tile(qkv_w_ptr + (lw + 1) * NQKV * H, NQKV, H, qkv0, R_QKV * more, TR_QKV, 0, TK_H)
        _sync(counter_ptr, barrier + 4, SYNC)
        # E: x += g @ Wd^T
        for m in range(rows):
            y = _dot(wd1, _row(g_ptr + m * F, F, 0, FK1))
            if FK2 > 0:
                y += _dot(wd2, _row(g_ptr + m * F, F, FK1, FK2))
            _residual_band(x_ptr + m * H, down0, R_DOWN, H, y, TR_DOWN)

    # H: the head over each stream's last row
    wh = _tile(head_w_ptr, V, H, head0, R_HEAD, TR_HEAD, 0, TK_H)
    _sync(counter_ptr, 1 + 5 * n_layers, SYNC)
    for s in range(streams):
        xr = _normed_row(x_ptr + (s * RPS + RPS - 1) * H, final_norm_ptr, H, eps, TK_H)
        y = _dot(wh, xr).to(x_ptr.dtype.element_ty).to(tl.float32)
        _store_band(logits_ptr + s * V, head0, R_HEAD, V, y, TR_HEAD)
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
    rows_per_stream: int,
    index: torch.Tensor | None = None,
    pdl: bool = False,
) -> torch.Tensor:
    """One code-predictor pass over B streams -> logits (B, V) float32 of each stream's last row.

    inputs (B * rows_per_stream, H_in): the pass's input rows, stream by stream; or, with ``index``
    (B,) int32 / int64, a table (vocab, H_in) whose rows ``index`` are the inputs (one row per stream).
    head (V, H); caches (L, B, Hkv, T, D): row r of stream s is at position pos0 + r, and attends to
    positions 0..pos0 + r of its stream (earlier passes wrote the rest). counter: (2,) int32 zeros,
    owned by the caller and left zeroed (the grid barrier's); launches sharing it must not overlap.
    """
    w = weights
    w.check()
    n_layers, hidden = w.ln1.shape
    head_dim = w.q_norm.shape[1]
    kv_heads = (w.qkv.shape[1] // head_dim - w.q_heads) // 2
    ffn = w.down.shape[2]
    vocab = head.shape[0]
    h_in = inputs.shape[1]
    if rows_per_stream not in (1, 2):
        raise ValueError(f"rows_per_stream must be 1 or 2, got {rows_per_stream}")
    if index is not None:
        if index.dim() != 1 or index.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"index must be 1-D int32 or int64, got {index.dtype} {tuple(index.shape)}")
        if rows_per_stream != 1:
            raise ValueError("an index gives one input row per stream")
        streams = index.shape[0]
    else:
        if inputs.shape[0] % rows_per_stream:
            raise ValueError(f"{inputs.shape[0]} input rows are not {rows_per_stream} per stream")
        streams = inputs.shape[0] // rows_per_stream
    positions = k_cache.shape[3]
    cache_shape = (n_layers, streams, kv_heads, positions, head_dim)
    if tuple(k_cache.shape) != cache_shape or v_cache.shape != k_cache.shape:
        raise ValueError(f"caches must be {cache_shape}, got {tuple(k_cache.shape)}, {tuple(v_cache.shape)}")
    if not 0 <= pos0 <= positions - rows_per_stream:
        raise ValueError(f"positions {pos0}..{pos0 + rows_per_stream - 1} outside the cache's {positions}")
    if positions & (positions - 1):
        raise ValueError(f"the cache length must be a power of two, got {positions}")
    if head.shape != (vocab, hidden) or (w.proj is None and h_in != hidden):
        raise ValueError(f"head must be (V, {hidden}) and inputs {hidden} wide without a projection")
    if w.proj is not None and w.proj.shape[1] != h_in:
        raise ValueError(f"inputs are {h_in} wide, the projection takes {w.proj.shape[1]}")
    if counter.dtype != torch.int32 or counter.shape != (2,):
        raise TypeError("counter must be (2,) int32")
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

    dev, rows = inputs.device, streams * rows_per_stream
    q_width = w.q_heads * head_dim
    x = torch.empty((rows, hidden), device=dev, dtype=dtype)
    qkv = torch.empty((rows, w.qkv.shape[1]), device=dev, dtype=dtype)
    attn = torch.empty((rows, q_width), device=dev, dtype=dtype)
    g = torch.empty((rows, ffn), device=dev, dtype=dtype)
    logits = torch.empty((streams, vocab), device=dev, dtype=torch.float32)
    if streams == 0:
        return logits
    programs = _programs(dev)

    def band(n: int) -> int:
        return triton.cdiv(n, programs)

    r_gu = band(ffn)
    gu1, gu2 = _split(r_gu)
    fk1, fk2 = _split(ffn)
    pow2 = triton.next_power_of_2
    sync = programs > 1
    _decoder_pass_kernel[(programs,)](
        inputs,
        index if index is not None else inputs,
        inputs.stride(0),
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
        streams,
        pos0,
        n_layers,
        w.eps,
        head_dim**-0.5 * LOG2_E,
        band(hidden),
        band(w.qkv.shape[1]),
        band(hidden),
        r_gu,
        band(hidden),
        band(vocab),
        HT=h_in,
        H=hidden,
        F=ffn,
        V=vocab,
        Q_HEADS=w.q_heads,
        KV_HEADS=kv_heads,
        HEAD_DIM=head_dim,
        T=positions,
        RPS=rows_per_stream,
        TK_HT=pow2(h_in),
        TK_H=pow2(hidden),
        TK_A=pow2(q_width),
        FK1=fk1,
        FK2=fk2,
        TR_IN=pow2(band(hidden)),
        TR_QKV=pow2(band(w.qkv.shape[1])),
        TR_O=pow2(band(hidden)),
        GU1=gu1,
        GU2=gu2,
        TR_DOWN=pow2(band(hidden)),
        TR_HEAD=pow2(band(vocab)),
        HAS_INDEX=index is not None,
        HAS_PROJ=w.proj is not None,
        SYNC=sync,
        num_warps=NUM_WARPS,
        num_stages=1,
        **pdl_launch(pdl, dev),
    )
    return logits


__all__ = ["PassWeights", "decoder_pass"]
