"""Decode attention for the Qwen3-TTS talker: one query token per sequence over a paged KV cache.

Shapes (talker, both 0.6B and 1.7B): 16 query heads, 8 KV heads (GQA group G = 2), head_dim 128.

    q           (B, Hq, D)                  one new token per row, any strides with stride(-1) == 1
    k_cache     (num_blocks, Hkv, PAGE, D)  keys of token t of slot s sit at
                                            [block_table[s, t // PAGE], :, t % PAGE]
    v_cache     (num_blocks, Hkv, PAGE, D)
    block_table (S, max_blocks) int32       slot s's blocks in token order (any order, need not be
                                            contiguous; entries past a slot's length are never read)
    slot_idx    (B,) int32                  which block-table row b reads
    lengths     (B,) int32                  valid keys of row b, the current token included (0 = padding row)
    out         (B, Hq, D)                  softmax(q . K^T * scale) . V per query head; zeros for a length-0 row

A slot-contiguous cache (num_slots, Hkv, L, D) is the case PAGE = L with block_table[s, 0] = s
(``contiguous_block_table``; the default when no table is given): one kernel serves both the talker's
paged cache and the code predictor's 16-position cache made per frame.

Algorithm (FlashDecoding with the GQA group packed into the M dimension of the matmuls):

1. Grid (B, Hkv, S). Program (b, h, s) loads the G query rows of KV head h as one (BLOCK_H, D) tile,
   BLOCK_H = max(16, next_pow2(G)) because tl.dot needs M >= 16; the padding rows are zeros and are
   never stored. K and V of a (row, KV head) are thus read from HBM exactly once for all G query heads.
2. The program walks its split's tokens [s * tokens_per_split, min(length, (s + 1) * tokens_per_split))
   in BLOCK_N tiles. Each tile lies in one page (PAGE % BLOCK_N == 0, tokens_per_split a multiple of
   BLOCK_N, or the whole row one page), so the program loads the tile's block id once, a scalar, and
   the tile's K and V rows are contiguous within that block, as in the slot-contiguous layout.
   scores = tl.dot(q, K^T) in fp32, online softmax in fp32 in the log2 domain (running max m,
   running sum l, accumulator acc rescaled by exp2(m_old - m_new)), acc += tl.dot(p, V).
3. S == 1: the program writes acc / l straight to out. S > 1: it writes acc / l and the log-sum-exp
   m + log2(l) per query head to an fp32 workspace, and a combine kernel with grid (B, Hq) merges the
   S partials: out = sum_s 2^(lse_s - max) * o_s / sum_s 2^(lse_s - max). An empty split (length shorter
   than the split start) writes lse = -inf and weighs nothing.

With a ``QKVPrologue`` (decode rows that each add one token to their own slot: the talker's frame, the
code predictor's one-row passes) the kernel also does qk_norm_rope.py's work, one launch a layer fewer
in a B = 1 frame's chain of ~700: each program norms and rotates its G queries and its KV head's new
key from the q|k|v row (a few hundred elements, cheaper than a launch), walks the cache before the new
token, and the split holding the new token writes its key and value to the cache and folds it into its
softmax from registers. No program reads a cache entry this launch writes.

The number of splits is chosen on the host from the batch size and an upper bound on the lengths that the
caller already knows (no device->host sync): the fewest splits that fill whole waves of programs across
the GPU's multiprocessors, each split keeping at least MIN_TOKENS_PER_SPLIT tokens. Plan once per step
(`plan_decode_attention`, in decode_attention_plan.py) and reuse the plan for all 28 layers; a CUDA graph captured with a plan replays
it for any lengths and block tables up to the plan's bound (both are read on the device).

Memory-bound by design: per (row, KV head) the kernel reads length x D x 2 (K and V) elements once, for
all G query heads; at 2 x G FLOP per element read (bf16: 2 FLOP/byte against the H200's ~200 FLOP/byte
balance point) the matmuls never matter, so the padded rows of BLOCK_H cost nothing measurable. The
block table adds one 4-byte load per 64-token tile (32 KiB of K and V in bf16).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from voicewire.kernels.decode_attention_plan import (
    DecodeAttentionPlan,
    QKVPrologue,
    check_decode_bounds,
    check_decode_inputs,
    contiguous_block_table,
    plan_decode_attention,
)
from voicewire.kernels.launch_checks import LOG2_E, MIN_DOT_DIM
from voicewire.kernels.pdl import pdl_enter, pdl_launch
from voicewire.kernels.qk_rope import rope_angles, rope_heads


@triton.jit
def _decode_attention_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    table_ptr,
    slot_ptr,
    len_ptr,
    out_ptr,
    part_o_ptr,
    part_lse_ptr,
    qk_scale_log2,
    tokens_per_split,
    stride_qb,
    stride_qh,
    stride_table,
    stride_kb,
    stride_kh,
    stride_kt,
    stride_vb,
    stride_vh,
    stride_vt,
    stride_ob,
    stride_oh,
    stride_pb,
    stride_ph,
    stride_ps,
    stride_lb,
    stride_lh,
    qkv_ptr,
    q_norm_ptr,
    k_norm_ptr,
    inv_freq_ptr,
    stride_qkv,
    eps,
    GROUP: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE: tl.constexpr,
    SPLIT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    PROLOGUE: tl.constexpr,
    Q_HEADS: tl.constexpr,
    KV_HEADS: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pdl_enter(USE_PDL)
    row = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    length = tl.load(len_ptr + row)
    table_row = table_ptr + tl.load(slot_ptr + row).to(tl.int64) * stride_table
    lo = split * tokens_per_split
    hi = tl.minimum(length, lo + tokens_per_split)

    offs_h = tl.arange(0, BLOCK_H)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    heads = kv_head * GROUP + offs_h  # query heads of this KV head (GQA: head i reads KV head i // G)
    head_mask = offs_h < GROUP
    k_head = k_ptr + kv_head.to(tl.int64) * stride_kh
    v_head = v_ptr + kv_head.to(tl.int64) * stride_vh

    if PROLOGUE:  # q and the new token's k, v from the q|k|v row (module docstring); the cache up to it
        pos = length - 1
        qkv_row = qkv_ptr + row.to(tl.int64) * stride_qkv
        cos, sin = rope_angles(pos, inv_freq_ptr, tl.arange(0, HEAD_DIM // 2), qkv_ptr.dtype.element_ty)
        q_src = qkv_row + heads[:, None] * HEAD_DIM
        q = rope_heads(q_src, head_mask[:, None], q_norm_ptr, cos, sin, eps, HEAD_DIM)  # (BLOCK_H, D)
        one = tl.arange(0, 1)[:, None]  # the KV head as a one-head tile
        k_src = qkv_row + (Q_HEADS + kv_head + one) * HEAD_DIM
        k_new = rope_heads(k_src, one == 0, k_norm_ptr, cos, sin, eps, HEAD_DIM)  # (1, D)
        v_new = tl.load(qkv_row + (Q_HEADS + KV_HEADS + kv_head) * HEAD_DIM + offs_d[None, :])  # (1, D)
        cached = tl.minimum(hi, pos)
    else:
        q = tl.load(
            q_ptr + row.to(tl.int64) * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
            mask=head_mask[:, None],
            other=0.0,
        )  # (BLOCK_H, D)
        cached = hi

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, HEAD_DIM], dtype=tl.float32)
    # Every iteration holds at least one valid token (start < cached): m_new is finite from the first one on.
    for start in range(lo, cached, BLOCK_N):
        tokens = start + offs_n
        token_mask = tokens < cached
        # The tile's page, once per tile. int64: 16k blocks x 8 heads x 64 tokens x 128 dims is 2^30
        # elements per layer, past int32 offsets at twice that.
        block = tl.load(table_row + start // PAGE).to(tl.int64)
        in_page = (start % PAGE) + offs_n
        k_base = k_head + block * stride_kb
        v_base = v_head + block * stride_vb
        # Masked-off rows read 0, never the cache: stale or NaN entries past a length cannot leak in.
        k = tl.load(
            k_base + in_page[:, None] * stride_kt + offs_d[None, :], mask=token_mask[:, None], other=0.0
        )  # (BLOCK_N, D)
        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale_log2  # (BLOCK_H, BLOCK_N)
        scores = tl.where(token_mask[None, :], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(
            v_base + in_page[:, None] * stride_vt + offs_d[None, :], mask=token_mask[:, None], other=0.0
        )  # (BLOCK_N, D)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    if PROLOGUE:  # noqa: SIM102 (a constexpr branch: compiled out when off)
        if (lo <= pos) & (pos < hi):  # the new token's split: it writes it to the cache and attends to it
            block = tl.load(table_row + pos // PAGE).to(tl.int64)
            at = pos % PAGE
            tl.store(k_head + block * stride_kb + at * stride_kt + offs_d[None, :], k_new)
            tl.store(v_head + block * stride_vb + at * stride_vt + offs_d[None, :], v_new)
            score = tl.sum(q.to(tl.float32) * k_new.to(tl.float32), 1) * qk_scale_log2  # (BLOCK_H,)
            m_new = tl.maximum(m_i, score)
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(score - m_new)
            l_i = l_i * alpha + p
            acc = acc * alpha[:, None] + p.to(v_new.dtype).to(tl.float32)[:, None] * v_new.to(tl.float32)
            m_i = m_new

    # An empty range (length 0, or a split past the length) leaves l = 0, acc = 0: output 0, lse = -inf.
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    o = acc / l_safe[:, None]
    if SPLIT:
        part_o = (
            part_o_ptr + row * stride_pb + heads[:, None] * stride_ph + split * stride_ps + offs_d[None, :]
        )
        tl.store(part_o, o, mask=head_mask[:, None])
        lse = m_i + tl.log2(l_safe)
        tl.store(part_lse_ptr + row * stride_lb + heads * stride_lh + split, lse, mask=head_mask)
    else:
        out = out_ptr + row.to(tl.int64) * stride_ob + heads[:, None] * stride_oh + offs_d[None, :]
        tl.store(out, o.to(out_ptr.dtype.element_ty), mask=head_mask[:, None])


@triton.jit
def _decode_combine_kernel(
    part_o_ptr,
    part_lse_ptr,
    out_ptr,
    num_splits,
    stride_pb,
    stride_ph,
    stride_ps,
    stride_lb,
    stride_lh,
    stride_ob,
    stride_oh,
    BLOCK_S: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pdl_enter(USE_PDL)
    row = tl.program_id(0)
    head = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, HEAD_DIM)
    split_mask = offs_s < num_splits

    lse = tl.load(
        part_lse_ptr + row * stride_lb + head * stride_lh + offs_s, mask=split_mask, other=float("-inf")
    )  # (BLOCK_S,)
    lse_max = tl.max(lse, 0)
    # All splits empty (a length-0 padding row): subtract 0 instead of -inf so the weights are 0, not NaN.
    lse_max = tl.where(lse_max == float("-inf"), 0.0, lse_max)
    weights = tl.exp2(lse - lse_max)  # (BLOCK_S,)
    part_o = tl.load(
        part_o_ptr + row * stride_pb + head * stride_ph + offs_s[:, None] * stride_ps + offs_d[None, :],
        mask=split_mask[:, None],
        other=0.0,
    )  # (BLOCK_S, D)
    numerator = tl.sum(weights[:, None] * part_o, 0)  # (D,)
    denominator = tl.sum(weights, 0)
    o = numerator / tl.where(denominator > 0.0, denominator, 1.0)
    out = out_ptr + row.to(tl.int64) * stride_ob + head * stride_oh + offs_d
    tl.store(out, o.to(out_ptr.dtype.element_ty))


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_idx: torch.Tensor,
    lengths: torch.Tensor,
    *,
    scale: float,
    block_table: torch.Tensor | None = None,
    max_len_bound: int | None = None,
    plan: DecodeAttentionPlan | None = None,
    out: torch.Tensor | None = None,
    check_bounds: bool = False,
    pdl: bool = False,
    prologue: QKVPrologue | None = None,
) -> torch.Tensor:
    """Attention of one query token per row over the first `lengths[b]` cached keys of its slot.

    q (B, Hq, D); k_cache, v_cache (num_blocks, Hkv, PAGE, D); block_table (S, max_blocks) int32;
    slot_idx, lengths (B,) int32 on q's device. Without a block table the cache is slot-contiguous
    (PAGE = L, block s = slot s; one small table is made per call: hot paths pass their own, made once
    by `contiguous_block_table`). PAGE must be a multiple of the plan's tile unless every slot is one page.
    Give either `plan` (from `plan_decode_attention`, reused across layers) or `max_len_bound`, a host-side
    upper bound on every length (e.g. the longest stream's position + 1, or max_blocks x PAGE). Lengths
    above the bound are silently truncated to it: the bound is a promise, checked only with
    `check_bounds=True` (which syncs). Returns out (B, Hq, D) in q's dtype (written into `out` when given).
    With ``prologue`` (qk_norm_rope.py's ``qk_norm_rope_attend``) q is not read: its queries and new keys
    come from ``prologue.qkv``, and q gives only their shape and dtype (pass ``out``).
    """
    if block_table is None:
        block_table = contiguous_block_table(k_cache.shape[0], q.device)
    check_decode_inputs(q, k_cache, v_cache, block_table, slot_idx, lengths, out)
    batch, q_heads, head_dim = q.shape
    num_blocks, kv_heads, page, _ = k_cache.shape
    if prologue is not None:
        prologue.check(q.shape, kv_heads, q.dtype)
    cache_len = block_table.shape[1] * page
    if plan is None:
        if max_len_bound is None:
            raise ValueError("give either plan or max_len_bound")
        plan = plan_decode_attention(batch, kv_heads, min(max_len_bound, cache_len), q.device, q.dtype)
    if page % plan.block_n and block_table.shape[1] > 1:
        raise ValueError(
            f"a page of {page} tokens is not a whole number of {plan.block_n}-token tiles: each tile must "
            "lie in one page (or every slot be one page)"
        )
    if check_bounds:
        check_decode_bounds(block_table, slot_idx, lengths, num_blocks, min(plan.max_len_bound, cache_len))
    if out is None:
        out = torch.empty_like(q)
    if batch == 0:
        return out

    group = q_heads // kv_heads
    block_h = max(MIN_DOT_DIM, triton.next_power_of_2(group))
    # fp32 inputs: keep the dot in IEEE fp32 (tf32 would cost ~1e-3 relative error for nothing here).
    dot_precision = "ieee" if q.dtype == torch.float32 else "tf32"
    split = plan.num_splits > 1
    if split:
        # fp32 partials; allocated per call (from the graph's private pool under CUDA-graph capture).
        part_o = torch.empty(
            (batch, q_heads, plan.num_splits, head_dim), device=q.device, dtype=torch.float32
        )
        part_lse = torch.empty((batch, q_heads, plan.num_splits), device=q.device, dtype=torch.float32)
    else:
        part_o = part_lse = out  # unused placeholders: the SPLIT=False kernel never touches them

    launch, p = pdl_launch(pdl, q.device), prologue
    _decode_attention_kernel[(batch, kv_heads, plan.num_splits)](
        q,
        k_cache,
        v_cache,
        block_table,
        slot_idx,
        lengths,
        out,
        part_o,
        part_lse,
        scale * LOG2_E,
        plan.tokens_per_split,
        q.stride(0),
        q.stride(1),
        block_table.stride(0),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        out.stride(0),
        out.stride(1),
        part_o.stride(0) if split else 0,
        part_o.stride(1) if split else 0,
        part_o.stride(2) if split else 0,
        part_lse.stride(0) if split else 0,
        part_lse.stride(1) if split else 0,
        # the prologue's tensors, or q standing in for them (PROLOGUE=False never reads them)
        *(
            (q, q, q, q, 0, 0.0) if p is None else (p.qkv, p.q_norm, p.k_norm, p.inv_freq, p.qkv.stride(0), p.eps)
        ),
        GROUP=group,
        BLOCK_H=block_h,
        BLOCK_N=plan.block_n,
        HEAD_DIM=head_dim,
        PAGE=page,
        SPLIT=split,
        DOT_PRECISION=dot_precision,
        PROLOGUE=prologue is not None,
        Q_HEADS=q_heads,
        KV_HEADS=kv_heads,
        num_warps=plan.num_warps,
        num_stages=plan.num_stages,
        **launch,
    )
    if split:
        _decode_combine_kernel[(batch, q_heads)](
            part_o,
            part_lse,
            out,
            plan.num_splits,
            part_o.stride(0),
            part_o.stride(1),
            part_o.stride(2),
            part_lse.stride(0),
            part_lse.stride(1),
            out.stride(0),
            out.stride(1),
            BLOCK_S=max(2, triton.next_power_of_2(plan.num_splits)),
            HEAD_DIM=head_dim,
            num_warps=1 if head_dim <= 64 else 2,
            **launch,
        )
    return out


__all__ = ["decode_attention"]
