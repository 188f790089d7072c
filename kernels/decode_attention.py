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
    contiguous_block_table,
    plan_decode_attention,
)
from voicewire.kernels.launch_checks import (
    LOG2_E,
    MIN_DOT_DIM,
    SUPPORTED_DTYPES,
    check_index,
    check_same_device_unit_stride,
    check_values_in_range,
)
from voicewire.kernels.pdl import pdl_enter, pdl_launch


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
    GROUP: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE: tl.constexpr,
    SPLIT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
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

    q = tl.load(
        q_ptr + row.to(tl.int64) * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
        mask=head_mask[:, None],
        other=0.0,
    )  # (BLOCK_H, D)
    k_head = k_ptr + kv_head.to(tl.int64) * stride_kh
    v_head = v_ptr + kv_head.to(tl.int64) * stride_vh

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, HEAD_DIM], dtype=tl.float32)
    # Every iteration holds at least one valid token (start < hi), so m_new is finite from the first one on.
    for start in range(lo, hi, BLOCK_N):
        tokens = start + offs_n
        token_mask = tokens < hi
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


def _check_decode_inputs(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    slot_idx: torch.Tensor,
    lengths: torch.Tensor,
    out: torch.Tensor | None,
) -> None:
    if q.dim() != 3:
        raise ValueError(f"q must be (B, Hq, D), got shape {tuple(q.shape)}")
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(
            "k_cache and v_cache must both be (num_blocks, Hkv, PAGE, D), got "
            f"{tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )
    batch, q_heads, head_dim = q.shape
    _, kv_heads, _, cache_dim = k_cache.shape
    if cache_dim != head_dim:
        raise ValueError(f"head_dim of q ({head_dim}) and of the cache ({cache_dim}) differ")
    if head_dim < MIN_DOT_DIM or head_dim & (head_dim - 1):
        raise ValueError(f"head_dim must be a power of two >= {MIN_DOT_DIM}, got {head_dim}")
    if q_heads % kv_heads:
        raise ValueError(f"query heads ({q_heads}) must be a multiple of KV heads ({kv_heads})")
    if q.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"q dtype must be one of {SUPPORTED_DTYPES}, got {q.dtype}")
    if k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise TypeError(f"q, k_cache, v_cache dtypes differ: {q.dtype}, {k_cache.dtype}, {v_cache.dtype}")
    if block_table.dtype != torch.int32 or block_table.dim() != 2 or block_table.shape[1] < 1:
        raise TypeError(
            f"block_table must be int32 (S, max_blocks), got {block_table.dtype} {tuple(block_table.shape)}"
        )
    check_index("slot_idx", slot_idx, batch)
    check_index("lengths", lengths, batch)
    tensors = {
        "q": q,
        "k_cache": k_cache,
        "v_cache": v_cache,
        "block_table": block_table,
        "slot_idx": slot_idx,
        "lengths": lengths,
    }
    if out is not None:
        if out.shape != q.shape or out.dtype != q.dtype:
            raise ValueError(f"out must be {tuple(q.shape)} {q.dtype}, got {tuple(out.shape)} {out.dtype}")
        tensors["out"] = out
    check_same_device_unit_stride(tensors, q.device)


def _check_decode_bounds(
    block_table: torch.Tensor, slot_idx: torch.Tensor, lengths: torch.Tensor, num_blocks: int, length_bound: int
) -> None:
    """Value checks that need a device->host sync: debugging and tests only, never in the hot path."""
    check_values_in_range("slot_idx", slot_idx, 0, block_table.shape[0] - 1)
    check_values_in_range("lengths (bound: the plan's and the block table's)", lengths, 0, length_bound)
    check_values_in_range("block_table", block_table, 0, num_blocks - 1)


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
    """
    if block_table is None:
        block_table = contiguous_block_table(k_cache.shape[0], q.device)
    _check_decode_inputs(q, k_cache, v_cache, block_table, slot_idx, lengths, out)
    batch, q_heads, head_dim = q.shape
    num_blocks, kv_heads, page, _ = k_cache.shape
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
        _check_decode_bounds(block_table, slot_idx, lengths, num_blocks, min(plan.max_len_bound, cache_len))
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

    launch = pdl_launch(pdl, q.device)
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
        GROUP=group,
        BLOCK_H=block_h,
        BLOCK_N=plan.block_n,
        HEAD_DIM=head_dim,
        PAGE=page,
        SPLIT=split,
        DOT_PRECISION=dot_precision,
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
