"""Plain-torch references for the attention kernels: slow, obvious, fp32 math; ground truth for tests.

Each function takes exactly the arguments of its kernel and returns what the kernel must return (and, for
the sliding window, leaves the cache as the kernel must leave it). Loops over rows are fine here: these run
on tiny test shapes and once per benchmark shape as a cross-check, never in serving.
"""

from __future__ import annotations

import torch


def _softmax_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """Explicit masked softmax attention in fp32. q (H, Tq, D), k/v (H, Tk, D), mask (Tq, Tk) bool."""
    scores = torch.einsum("hqd,hkd->hqk", q.float(), k.float()) * scale  # (H, Tq, Tk)
    scores = scores.masked_fill(~mask, float("-inf"))
    # A query with no visible key gets 0, as the kernels do (length-0 padding rows).
    has_key = mask.any(dim=-1)  # (Tq,)
    probs = torch.softmax(scores.masked_fill(~has_key[:, None], 0.0), dim=-1) * has_key[:, None]
    return torch.einsum("hqk,hkd->hqd", probs, v.float())  # (H, Tq, D)


def decode_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_idx: torch.Tensor,
    lengths: torch.Tensor,
    *,
    scale: float,
) -> torch.Tensor:
    """Reference for `kernels.decode_attention.decode_attention` (same layouts). Returns (B, Hq, D)."""
    batch, q_heads, _ = q.shape
    kv_heads = k_cache.shape[1]
    group = q_heads // kv_heads
    out = torch.empty_like(q)
    for row in range(batch):
        slot, length = int(slot_idx[row]), int(lengths[row])
        # GQA: query head i reads KV head i // group (what repeat_interleave and SDPA's enable_gqa do).
        k = k_cache[slot, :, :length].repeat_interleave(group, dim=0)  # (Hq, length, D)
        v = v_cache[slot, :, :length].repeat_interleave(group, dim=0)
        mask = torch.ones((1, length), dtype=torch.bool, device=q.device)
        out[row] = _softmax_attention(q[row, :, None], k, v, mask, scale)[:, 0].to(q.dtype)
    return out


def window_mask(query_pos: torch.Tensor, key_pos: torch.Tensor, window: int) -> torch.Tensor:
    """Causal sliding window as Hugging Face defines it for Qwen3-TTS's codec (`sliding_window` = 72):
    query i sees key j iff i - window < j <= i, i.e. itself and the window - 1 keys before it."""
    delta = query_pos[:, None] - key_pos[None, :]  # (Tq, Tk)
    return (delta >= 0) & (delta < window)


def sliding_window_attention_ref(
    q: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_idx: torch.Tensor,
    positions: torch.Tensor,
    *,
    window: int,
    scale: float,
    chunk_lengths: torch.Tensor | None = None,
    update_cache: bool = True,
) -> torch.Tensor:
    """Reference for `kernels.sliding_window_attention.sliding_window_attention` (same ring layout).

    q, k_new, v_new (B, H, T, D); k_cache, v_cache (num_slots, H, C, D) rings holding the key of absolute
    frame j at [slot, :, j % C]; positions (B,) = frames the stream had before this chunk; chunk_lengths
    (B,) = real frames per row (default T), padding frames come out as zeros and are not appended.
    Returns (B, H, T, D); appends the chunk to the rings when `update_cache`.
    """
    batch, _, chunk, _ = q.shape
    capacity = k_cache.shape[2]
    real = [chunk] * batch if chunk_lengths is None else [int(n) for n in chunk_lengths]
    out = torch.zeros_like(q)
    for row in range(batch):
        slot, pos, n = int(slot_idx[row]), int(positions[row]), real[row]
        cached_pos = torch.arange(max(0, pos - capacity), pos, device=q.device)  # oldest first
        ring = cached_pos % capacity
        k = torch.cat([k_cache[slot][:, ring], k_new[row, :, :n]], dim=1)  # (H, n_cached + n, D)
        v = torch.cat([v_cache[slot][:, ring], v_new[row, :, :n]], dim=1)
        query_pos = pos + torch.arange(n, device=q.device)
        key_pos = torch.cat([cached_pos, query_pos])
        mask = window_mask(query_pos, key_pos, window)
        out[row, :, :n] = _softmax_attention(q[row, :, :n], k, v, mask, scale).to(q.dtype)
    if update_cache:
        for row in range(batch):
            slot, pos, n = int(slot_idx[row]), int(positions[row]), real[row]
            # Only the last C frames of a chunk longer than the ring survive.
            for t in range(max(0, n - capacity), n):
                k_cache[slot, :, (pos + t) % capacity] = k_new[row, :, t]
                v_cache[slot, :, (pos + t) % capacity] = v_new[row, :, t]
    return out


def sliding_window_attention_offline_ref(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, window: int, scale: float
) -> torch.Tensor:
    """Whole-sequence causal sliding-window attention, (B, H, N, D) -> (B, H, N, D): what the codec's
    offline decode computes, and what streaming chunk by chunk through the ring must reproduce."""
    positions = torch.arange(q.shape[2], device=q.device)
    mask = window_mask(positions, positions, window)
    return torch.stack([_softmax_attention(q[b], k[b], v[b], mask, scale) for b in range(q.shape[0])]).to(
        q.dtype
    )


__all__ = [
    "decode_attention_ref",
    "sliding_window_attention_offline_ref",
    "sliding_window_attention_ref",
    "window_mask",
]
