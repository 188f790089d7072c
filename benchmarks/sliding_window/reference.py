"""Plain-torch references for the streaming sliding-window attention kernel (sliding_window_attention.py):
slow, obvious, fp32 math; ground truth for its tests. Each takes the kernel's arguments and returns (and
leaves the ring) as the kernel must.
"""

from __future__ import annotations

import torch

from voicewire.kernels.reference import softmax_attention


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
    """Reference for `sliding_window_attention.sliding_window_attention` (same ring layout).

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
        out[row, :, :n] = softmax_attention(q[row, :, :n], k, v, mask, scale).to(q.dtype)
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
    return torch.stack([softmax_attention(q[b], k[b], v[b], mask, scale) for b in range(q.shape[0])]).to(
        q.dtype
    )


__all__ = ["sliding_window_attention_offline_ref", "sliding_window_attention_ref", "window_mask"]
