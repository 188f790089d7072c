"""Streaming causal sliding-window attention for the Qwen3-TTS codec decoder (8 layers, window 72 frames,
16 heads x head_dim 64, MHA), batched across streams, with the per-stream K/V window kept in a ring.

Not in the served tree: the codec decoder (engine/qwen3/codec_decoder.py) runs its windowed attention
as SDPA over its state's K/V tail and the chunk, and this kernel waits here until a GPU measurement inside the codec shows it pays off there.
benchmarks/kernels_bench.py measures it alone; tests/kernels/test_sliding_window_attention.py checks it
against reference.py beside it.

Window (Hugging Face's definition, `sliding_window` = 72): the query at absolute frame i sees keys
i - 72 < j <= i, itself and the 71 frames before it. A stream therefore needs at most window - 1 = 71 past
frames of K/V per layer; the ring keeps C >= window - 1 of them (C = 72 by default, DESIGN's "last 72").

Cache layout (one ring per layer for K and one for V):

    k_cache, v_cache (num_slots, H, C, D)   the key of the stream's absolute frame j sits at [slot, :, j % C]
    positions        (B,) int32             frames the stream had before this chunk (0 for a new stream:
                                            then the ring's contents are ignored, so slots need no reset)

A ring needs no shifting after a chunk (a contiguous [.., 72 + T, ..] window would be memmoved every call):
the chunk's frames are written over the oldest entries, in place, by the same kernel.

Per call (one decoder layer, all due streams):

    q, k_new, v_new  (B, H, T, D)   the chunk's T new frames (1 <= T <= MAX_CHUNK_FRAMES), RoPE applied;
                                    any strides with stride(-1) == 1, e.g. a (B, T, H, D) buffer transposed
    slot_idx         (B,) int32     the stream's slot; rows that append need distinct slots
    chunk_lengths    (B,) int32     optional: real frames of row b's chunk (<= T); the rest is padding
    out              (B, H, T, D)   same strides as q; padding frames are written as zeros

Algorithm: grid (B, H), one program per (stream, head) holds the whole chunk, so the window fits in two
tiles and needs no loop:
1. Load q, k_new, v_new as (BLOCK_T, D) tiles and the ring as a (BLOCK_C, D) tile. Ring entry c holds the
   frame pos - 1 - age(c), age(c) = (pos - 1 - c) mod C (0 = newest); it exists iff age < pos.
2. Scores against the ring (BLOCK_T, BLOCK_C) and against the chunk (BLOCK_T, BLOCK_T), both tl.dot in
   fp32. Query t (frame pos + t) sees ring entry c iff age(c) < window - 1 - t, and chunk frame s iff
   s <= t and t - s < window.
3. One softmax in fp32 over both score tiles (max, exp2, sum), out = (P_ring V_ring + P_new V_new) / l.
4. With update_cache, after a barrier (every thread's ring reads are done), write frame pos + s of the
   chunk to ring index (pos + s) % C, for the last min(n, C) real frames (n = chunk length of the row).
The caller then advances positions by the chunk lengths (the engine owns positions: RoPE reads them too).

Padding for CUDA graphs bucketed by (streams, frames): give each row its real frame count in chunk_lengths;
padded frames are neither attended to nor appended. A padding row (0 frames) still reads a ring, so point
it at any valid slot (e.g. one padding slot shared by all padding rows); it writes nothing. Bytes per (stream, head): ring 2 x C x D, chunk 4 x T x D (q, k, v, out) elements, plus
2 x T x D written to the ring; all FLOPs are noise.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from voicewire.kernels.launch_checks import (
    LOG2_E,
    MIN_DOT_DIM,
    SUPPORTED_DTYPES,
    check_index,
    check_same_device_unit_stride,
    check_values_in_range,
)

# Hugging Face config `sliding_window` of the Qwen3-TTS-12Hz codec decoder's 8 transformer layers.
CODEC_WINDOW = 72
# Chunks are 1-2 frames first, then a few (DESIGN); 128 frames = 10.24 s of audio in one call is far past
# that and keeps the (BLOCK_T, BLOCK_T) score tile at 64 KiB of fp32.
MAX_CHUNK_FRAMES = 128
# The ring is one tile: 256 entries x 64 dims x 2 B = 32 KiB per K and V.
MAX_RING_CAPACITY = 256
NUM_WARPS = 4


@triton.jit
def _sliding_window_kernel(
    q_ptr,
    k_new_ptr,
    v_new_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    pos_ptr,
    chunk_len_ptr,
    out_ptr,
    qk_scale_log2,
    num_frames,
    capacity,
    window,
    stride_qb,
    stride_qh,
    stride_qt,
    stride_knb,
    stride_knh,
    stride_knt,
    stride_vnb,
    stride_vnh,
    stride_vnt,
    stride_kcs,
    stride_kch,
    stride_kcc,
    stride_vcs,
    stride_vch,
    stride_vcc,
    stride_ob,
    stride_oh,
    stride_ot,
    BLOCK_T: tl.constexpr,
    BLOCK_C: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    UPDATE_CACHE: tl.constexpr,
    VARLEN: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    slot = tl.load(slot_ptr + row).to(tl.int64)
    pos = tl.load(pos_ptr + row)
    num_new = num_frames  # real frames of this row's chunk; the rest of T is padding
    if VARLEN:
        num_new = tl.minimum(tl.load(chunk_len_ptr + row), num_new)

    offs_t = tl.arange(0, BLOCK_T)
    offs_c = tl.arange(0, BLOCK_C)
    offs_d = tl.arange(0, HEAD_DIM)
    t_mask = offs_t < num_new

    q = tl.load(
        q_ptr + row * stride_qb + head * stride_qh + offs_t[:, None] * stride_qt + offs_d[None, :],
        mask=t_mask[:, None],
        other=0.0,
    )  # (BLOCK_T, D)
    k_new = tl.load(
        k_new_ptr + row * stride_knb + head * stride_knh + offs_t[:, None] * stride_knt + offs_d[None, :],
        mask=t_mask[:, None],
        other=0.0,
    )  # (BLOCK_T, D)
    v_new = tl.load(
        v_new_ptr + row * stride_vnb + head * stride_vnh + offs_t[:, None] * stride_vnt + offs_d[None, :],
        mask=t_mask[:, None],
        other=0.0,
    )  # (BLOCK_T, D)

    # Age of ring entry c in frames before the chunk (0 = newest). The double mod is right under both
    # truncating (GPU) and flooring (interpreter) remainder of a negative pos - 1 - c.
    age = ((pos - 1 - offs_c) % capacity + capacity) % capacity  # (BLOCK_C,)
    written = (offs_c < capacity) & (age < pos)
    k_ring_ptrs = k_cache_ptr + slot * stride_kcs + head * stride_kch + offs_c[:, None] * stride_kcc
    v_ring_ptrs = v_cache_ptr + slot * stride_vcs + head * stride_vch + offs_c[:, None] * stride_vcc
    # Never-written entries are loaded as 0, so uninitialised (even NaN) ring memory cannot reach P @ V.
    k_ring = tl.load(k_ring_ptrs + offs_d[None, :], mask=written[:, None], other=0.0)  # (BLOCK_C, D)
    v_ring = tl.load(v_ring_ptrs + offs_d[None, :], mask=written[:, None], other=0.0)  # (BLOCK_C, D)

    # Query t is frame pos + t; ring frame pos - 1 - age is inside its window iff age < window - 1 - t.
    ring_visible = written[None, :] & (age[None, :] < (window - 1 - offs_t)[:, None])  # (BLOCK_T, BLOCK_C)
    delta = offs_t[:, None] - offs_t[None, :]  # query frame - key frame within the chunk
    new_visible = (delta >= 0) & (delta < window) & t_mask[None, :]  # (BLOCK_T, BLOCK_T)

    s_ring = tl.dot(q, tl.trans(k_ring), input_precision=DOT_PRECISION) * qk_scale_log2
    s_ring = tl.where(ring_visible, s_ring, float("-inf"))  # (BLOCK_T, BLOCK_C)
    s_new = tl.dot(q, tl.trans(k_new), input_precision=DOT_PRECISION) * qk_scale_log2
    s_new = tl.where(new_visible, s_new, float("-inf"))  # (BLOCK_T, BLOCK_T)

    m = tl.maximum(tl.max(s_ring, 1), tl.max(s_new, 1))  # (BLOCK_T,)
    # Real queries always see themselves; only padding rows can be empty: keep them finite, not NaN.
    m = tl.where(m == float("-inf"), 0.0, m)
    p_ring = tl.exp2(s_ring - m[:, None])
    p_new = tl.exp2(s_new - m[:, None])
    l_sum = tl.sum(p_ring, 1) + tl.sum(p_new, 1)
    acc = tl.dot(p_ring.to(v_ring.dtype), v_ring, input_precision=DOT_PRECISION)
    acc += tl.dot(p_new.to(v_new.dtype), v_new, input_precision=DOT_PRECISION)  # (BLOCK_T, D)
    o = acc / tl.where(l_sum > 0.0, l_sum, 1.0)[:, None]
    o = tl.where(t_mask[:, None], o, 0.0)  # padding frames past the row's chunk length read as zeros
    tl.store(
        out_ptr + row * stride_ob + head * stride_oh + offs_t[:, None] * stride_ot + offs_d[None, :],
        o.to(out_ptr.dtype.element_ty),
        mask=(offs_t < num_frames)[:, None],
    )

    if UPDATE_CACHE:
        # Other threads of this program may still be reading the entries about to be overwritten.
        tl.debug_barrier()
        ring_idx = (pos + offs_t) % capacity  # (BLOCK_T,)
        keep = t_mask & (offs_t >= num_new - capacity)  # the last min(T, C) frames
        k_dst = k_cache_ptr + slot * stride_kcs + head * stride_kch + ring_idx[:, None] * stride_kcc
        v_dst = v_cache_ptr + slot * stride_vcs + head * stride_vch + ring_idx[:, None] * stride_vcc
        tl.store(k_dst + offs_d[None, :], k_new, mask=keep[:, None])
        tl.store(v_dst + offs_d[None, :], v_new, mask=keep[:, None])


def _check_window_inputs(
    q: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_idx: torch.Tensor,
    positions: torch.Tensor,
    chunk_lengths: torch.Tensor | None,
    window: int,
    out: torch.Tensor | None,
) -> None:
    if q.dim() != 4 or k_new.shape != q.shape or v_new.shape != q.shape:
        raise ValueError(
            "q, k_new, v_new must all be (B, H, T, D), got "
            f"{tuple(q.shape)}, {tuple(k_new.shape)}, {tuple(v_new.shape)}"
        )
    if k_cache.dim() != 4 or v_cache.shape != k_cache.shape:
        raise ValueError(
            "k_cache and v_cache must both be (num_slots, H, C, D), got "
            f"{tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )
    batch, heads, chunk, head_dim = q.shape
    _, cache_heads, capacity, cache_dim = k_cache.shape
    if (cache_heads, cache_dim) != (heads, head_dim):
        raise ValueError(
            f"cache heads/head_dim {(cache_heads, cache_dim)} differ from q's {(heads, head_dim)}"
        )
    if head_dim < MIN_DOT_DIM or head_dim & (head_dim - 1):
        raise ValueError(f"head_dim must be a power of two >= {MIN_DOT_DIM}, got {head_dim}")
    if not 1 <= chunk <= MAX_CHUNK_FRAMES:
        raise ValueError(f"chunk frames T must be in [1, {MAX_CHUNK_FRAMES}], got {chunk}")
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    if capacity < 1 or not window - 1 <= capacity <= MAX_RING_CAPACITY:
        raise ValueError(
            f"ring capacity C = {capacity} must hold the window's past (>= window - 1 = {window - 1}) "
            f"and fit one tile (<= {MAX_RING_CAPACITY})"
        )
    if q.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"q dtype must be one of {SUPPORTED_DTYPES}, got {q.dtype}")
    for name, tensor in (("k_new", k_new), ("v_new", v_new), ("k_cache", k_cache), ("v_cache", v_cache)):
        if tensor.dtype != q.dtype:
            raise TypeError(f"{name} dtype {tensor.dtype} differs from q's {q.dtype}")
    check_index("slot_idx", slot_idx, batch)
    check_index("positions", positions, batch)
    if chunk_lengths is not None:
        check_index("chunk_lengths", chunk_lengths, batch)
    tensors = {
        "q": q,
        "k_new": k_new,
        "v_new": v_new,
        "k_cache": k_cache,
        "v_cache": v_cache,
        "slot_idx": slot_idx,
        "positions": positions,
    }
    if chunk_lengths is not None:
        tensors["chunk_lengths"] = chunk_lengths
    if out is not None:
        if out.shape != q.shape or out.dtype != q.dtype:
            raise ValueError(f"out must be {tuple(q.shape)} {q.dtype}, got {tuple(out.shape)} {out.dtype}")
        tensors["out"] = out
    check_same_device_unit_stride(tensors, q.device)


def _check_window_bounds(
    slot_idx: torch.Tensor,
    positions: torch.Tensor,
    chunk_lengths: torch.Tensor | None,
    num_slots: int,
    chunk: int,
    update_cache: bool,
) -> None:
    """Value checks that need a device->host sync: debugging and tests only, never in the hot path."""
    check_values_in_range("slot_idx", slot_idx, 0, num_slots - 1)
    real = [chunk] * len(slot_idx) if chunk_lengths is None else chunk_lengths.tolist()
    # Rows that append must own their ring; padding rows (0 frames) may share one padding slot.
    writers = [s for s, n in zip(slot_idx.tolist(), real, strict=True) if update_cache and n > 0]
    if len(set(writers)) != len(writers):
        raise ValueError(f"rows that append need distinct slots (two would write one ring): {writers}")
    check_values_in_range("positions", positions, 0, 2**31 - 1 - MAX_CHUNK_FRAMES)
    if chunk_lengths is not None:
        check_values_in_range("chunk_lengths", chunk_lengths, 0, chunk)


def sliding_window_attention(
    q: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_idx: torch.Tensor,
    positions: torch.Tensor,
    *,
    scale: float,
    chunk_lengths: torch.Tensor | None = None,
    window: int = CODEC_WINDOW,
    update_cache: bool = True,
    out: torch.Tensor | None = None,
    check_bounds: bool = False,
) -> torch.Tensor:
    """Causal sliding-window attention of a chunk of T new frames per stream over the stream's ring.

    q, k_new, v_new (B, H, T, D); k_cache, v_cache (num_slots, H, C, D) rings, C >= window - 1;
    slot_idx, positions and optional chunk_lengths (B,) int32 on q's device (no chunk_lengths: every row
    has T real frames). Returns (B, H, T, D) with q's strides (into `out` when given). With `update_cache`
    the real frames' K/V are appended to the rings in place; the caller then adds the chunk lengths to
    positions. `check_bounds=True` validates slots, positions, chunk lengths (syncs; tests, debugging).
    """
    _check_window_inputs(q, k_new, v_new, k_cache, v_cache, slot_idx, positions, chunk_lengths, window, out)
    batch, heads, chunk, head_dim = q.shape
    num_slots, _, capacity, _ = k_cache.shape
    if check_bounds:
        _check_window_bounds(slot_idx, positions, chunk_lengths, num_slots, chunk, update_cache)
    if out is None:
        out = torch.empty_like(q)  # keeps q's strides, e.g. (B, T, H, D) memory behind a (B, H, T, D) view
    if batch == 0:
        return out

    _sliding_window_kernel[(batch, heads)](
        q,
        k_new,
        v_new,
        k_cache,
        v_cache,
        slot_idx,
        positions,
        positions if chunk_lengths is None else chunk_lengths,  # placeholder when VARLEN is off
        out,
        scale * LOG2_E,
        chunk,
        capacity,
        window,
        q.stride(0),
        q.stride(1),
        q.stride(2),
        k_new.stride(0),
        k_new.stride(1),
        k_new.stride(2),
        v_new.stride(0),
        v_new.stride(1),
        v_new.stride(2),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        out.stride(0),
        out.stride(1),
        out.stride(2),
        BLOCK_T=max(MIN_DOT_DIM, triton.next_power_of_2(chunk)),
        BLOCK_C=max(MIN_DOT_DIM, triton.next_power_of_2(capacity)),
        HEAD_DIM=head_dim,
        UPDATE_CACHE=update_cache,
        VARLEN=chunk_lengths is not None,
        # fp32 inputs: keep the dots in IEEE fp32 rather than tf32.
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=NUM_WARPS,
    )
    return out


__all__ = ["CODEC_WINDOW", "sliding_window_attention"]
