"""Qwen3 attention prologue for decode rows: per-head RMS norm on q and k, RoPE, and the K/V cache write.

    qkv         (M, (Hq + 2 Hkv) D)         the fused q|k|v projection of M rows (one token each)
    q_out       (M, Hq, D)                  normed and rotated queries
    k_cache     (num_blocks, Hkv, PAGE, D)  row m's key goes to [block_table[slots[m], p // PAGE], :,
                                            p % PAGE], p = positions[m] (normed, rotated)
    v_cache     (num_blocks, Hkv, PAGE, D)  and its value, as projected
    block_table (S, max_blocks) int32       each slot's blocks in token order (kernels/decode_attention.py);
                                            a slot-contiguous (S, Hkv, L, D) cache is PAGE = L, block s = slot s

Unfused this is ~15 kernels per layer (two norms, two rotations with their cat/neg, two cache writes);
here it is one. Up to ``HEAD_GRID_ROWS`` rows the grid is (M, Hq + Hkv), program (m, h) one head (one warp):
few rows get all their heads in parallel. Above, it is (M,): program m takes every head of its row as
(heads, D / 2) tiles, the row's cos / sin once, so a large batch is M programs rather than M x 24 tiny ones
(1.7B frame step on the H200: 4.1 us a call at 1 row per head against 6.0 per row; 8.5 against 5.0 at
256 rows). cos / sin are computed in fp32 from the position and rounded to the input dtype, and every elementwise
step is rounded where the unfused reference rounds it (rope.py / layers.py), so fp32 results match it
exactly and bf16 ones to rounding noise.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from voicewire.kernels.decode_attention_plan import contiguous_block_table
from voicewire.kernels.launch_checks import SUPPORTED_DTYPES, check_index, check_same_device_unit_stride
from voicewire.kernels.pdl import pdl_enter, pdl_launch

# Rows up to which each head is a program of its own. Between the two measured sizes (1 and 256 rows)
# the per-head grid stays within one wave of resident one-warp programs up to ~170 rows; 128 is the
# largest decode bucket below that.
HEAD_GRID_ROWS = 128


@triton.jit
def _rms_rope(x1, x2, w1, w2, cos, sin, eps, HEAD_DIM: tl.constexpr):
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
def _qk_norm_rope_store_kernel(
    qkv_ptr,
    q_out_ptr,
    q_norm_ptr,
    k_norm_ptr,
    inv_freq_ptr,
    k_cache_ptr,
    v_cache_ptr,
    table_ptr,
    slot_ptr,
    pos_ptr,
    stride_qkv,
    stride_qm,
    stride_qh,
    stride_table,
    stride_kb,
    stride_kh,
    stride_kl,
    stride_vb,
    stride_vh,
    stride_vl,
    eps,
    Q_HEADS: tl.constexpr,
    KV_HEADS: tl.constexpr,
    Q_BLOCK: tl.constexpr,
    KV_BLOCK: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE: tl.constexpr,
    PER_HEAD: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pdl_enter(USE_PDL)
    m = tl.program_id(0)
    if PER_HEAD:  # program (m, h): query head h, or KV head h - Q_HEADS (Q_BLOCK = KV_BLOCK = 1)
        h = tl.program_id(1)
        q0, kv0 = h, h - Q_HEADS
        run_q, run_kv = h < Q_HEADS, h >= Q_HEADS
    else:  # program m: every head of row m
        q0, kv0 = 0, 0
        run_q, run_kv = True, True
    half: tl.constexpr = HEAD_DIM // 2
    d = tl.arange(0, half)
    pos = tl.load(pos_ptr + m)
    angle = pos.to(tl.float32) * tl.load(inv_freq_ptr + d)
    dtype = qkv_ptr.dtype.element_ty
    cos = tl.cos(angle).to(dtype).to(tl.float32)
    sin = tl.sin(angle).to(dtype).to(tl.float32)
    row = qkv_ptr + m * stride_qkv

    if run_q:
        hq = q0 + tl.arange(0, Q_BLOCK)
        q_ok = (hq < Q_HEADS)[:, None]
        q_src = row + hq[:, None] * HEAD_DIM + d[None, :]
        w1 = tl.load(q_norm_ptr + d).to(tl.float32)
        w2 = tl.load(q_norm_ptr + half + d).to(tl.float32)
        x1 = tl.load(q_src, mask=q_ok, other=0.0)
        x2 = tl.load(q_src + half, mask=q_ok, other=0.0)
        o1, o2 = _rms_rope(x1, x2, w1, w2, cos, sin, eps, HEAD_DIM)
        q_dst = q_out_ptr + m * stride_qm + hq[:, None] * stride_qh + d[None, :]
        tl.store(q_dst, o1, mask=q_ok)
        tl.store(q_dst + half, o2, mask=q_ok)
    if run_kv:
        hk = kv0 + tl.arange(0, KV_BLOCK)
        kv_ok = (hk < KV_HEADS)[:, None]
        k_src = row + (Q_HEADS + hk[:, None]) * HEAD_DIM + d[None, :]
        w1 = tl.load(k_norm_ptr + d).to(tl.float32)
        w2 = tl.load(k_norm_ptr + half + d).to(tl.float32)
        x1 = tl.load(k_src, mask=kv_ok, other=0.0)
        x2 = tl.load(k_src + half, mask=kv_ok, other=0.0)
        o1, o2 = _rms_rope(x1, x2, w1, w2, cos, sin, eps, HEAD_DIM)
        slot = tl.load(slot_ptr + m).to(tl.int64)
        block = tl.load(table_ptr + slot * stride_table + pos // PAGE).to(tl.int64)
        at = pos % PAGE
        k_dst = k_cache_ptr + block * stride_kb + hk[:, None] * stride_kh + at * stride_kl + d[None, :]
        tl.store(k_dst, o1, mask=kv_ok)
        tl.store(k_dst + half, o2, mask=kv_ok)
        dv = tl.arange(0, HEAD_DIM)
        v_src = row + (Q_HEADS + KV_HEADS + hk[:, None]) * HEAD_DIM + dv[None, :]
        v_dst = v_cache_ptr + block * stride_vb + hk[:, None] * stride_vh + at * stride_vl + dv[None, :]
        tl.store(v_dst, tl.load(v_src, mask=kv_ok, other=0.0), mask=kv_ok)


def qk_norm_rope_store(
    qkv: torch.Tensor,
    q_norm: torch.Tensor,
    k_norm: torch.Tensor,
    inv_freq: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    positions: torch.Tensor,
    *,
    q_heads: int,
    eps: float,
    block_table: torch.Tensor | None = None,
    q_out: torch.Tensor | None = None,
    pdl: bool = False,
    head_grid_rows: int = HEAD_GRID_ROWS,
) -> torch.Tensor:
    """Normed, rotated queries (M, Hq, D); keys and values of the M rows written into the caches.

    slots, positions: (M,) int32; inv_freq (D / 2,) float32 (rope.inv_freq). Without ``block_table`` the
    caches are slot-contiguous (S, Hkv, L, D) (one small table is made per call: hot paths pass their own).
    Positions must be < max_blocks x PAGE, slots < S and table entries < num_blocks: the kernel does not
    check them (it runs inside CUDA graphs; the callers own the bounds).
    Up to ``head_grid_rows`` rows a program per (row, head), above a program per row (module docstring).
    """
    if qkv.dim() != 2 or k_cache.dim() != 4 or v_cache.shape != k_cache.shape:
        raise ValueError(
            f"qkv must be (M, W) and the caches (S, Hkv, L, D), got {tuple(qkv.shape)}, "
            f"{tuple(k_cache.shape)}, {tuple(v_cache.shape)}"
        )
    m = qkv.shape[0]
    _, kv_heads, _, head_dim = k_cache.shape
    if qkv.shape[1] != (q_heads + 2 * kv_heads) * head_dim:
        raise ValueError(f"qkv width {qkv.shape[1]} is not ({q_heads} + 2 x {kv_heads}) x {head_dim}")
    if head_dim % 2 or head_dim & (head_dim - 1):
        raise ValueError(f"head_dim must be a power of two, got {head_dim}")
    if qkv.dtype not in SUPPORTED_DTYPES or k_cache.dtype != qkv.dtype or v_cache.dtype != qkv.dtype:
        raise TypeError(f"qkv and the caches must share one of {SUPPORTED_DTYPES}")
    if q_norm.shape != (head_dim,) or k_norm.shape != (head_dim,) or inv_freq.shape != (head_dim // 2,):
        raise ValueError("q_norm / k_norm must be (D,) and inv_freq (D / 2,)")
    if inv_freq.dtype != torch.float32:
        raise TypeError(f"inv_freq must be float32, got {inv_freq.dtype}")
    if block_table is None:
        block_table = contiguous_block_table(k_cache.shape[0], qkv.device)
    if block_table.dtype != torch.int32 or block_table.dim() != 2:
        raise TypeError(
            f"block_table must be int32 (S, max_blocks), got {block_table.dtype} {tuple(block_table.shape)}"
        )
    check_index("slots", slots, m)
    check_index("positions", positions, m)
    if q_out is None:
        q_out = torch.empty((m, q_heads, head_dim), device=qkv.device, dtype=qkv.dtype)
    tensors = {
        "qkv": qkv,
        "q_out": q_out,
        "q_norm": q_norm,
        "k_norm": k_norm,
        "inv_freq": inv_freq,
        "k_cache": k_cache,
        "v_cache": v_cache,
        "block_table": block_table,
        "slots": slots,
        "positions": positions,
    }
    check_same_device_unit_stride(tensors, qkv.device)
    if m == 0:
        return q_out
    per_head = m <= head_grid_rows
    _qk_norm_rope_store_kernel[(m, q_heads + kv_heads) if per_head else (m,)](
        qkv,
        q_out,
        q_norm,
        k_norm,
        inv_freq,
        k_cache,
        v_cache,
        block_table,
        slots,
        positions,
        qkv.stride(0),
        q_out.stride(0),
        q_out.stride(1),
        block_table.stride(0),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        eps,
        Q_HEADS=q_heads,
        KV_HEADS=kv_heads,
        Q_BLOCK=1 if per_head else triton.next_power_of_2(q_heads),
        KV_BLOCK=1 if per_head else triton.next_power_of_2(kv_heads),
        HEAD_DIM=head_dim,
        PAGE=k_cache.shape[2],
        PER_HEAD=per_head,
        num_warps=1 if per_head else 4,
        **pdl_launch(pdl, qkv.device),
    )
    return q_out


__all__ = ["qk_norm_rope_store"]
