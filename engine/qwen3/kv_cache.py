"""The talker's KV cache: one preallocated region per slot, indexed by slot on the device.

Layout (layers, max_slots, kv_heads, max_len, head_dim) for K and V. A slot owns row ``slot`` of
every layer from ``open`` to ``close``; nothing is allocated per request, so opening and closing
streams cannot leak, and a reused slot needs no clearing: the attention mask only admits positions
a stream has written itself (``key <= position``), and every position is written before it is read.

Memory: 28 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes = 114 KiB per position in bf16 (either
size: both talkers have 8x128 KV heads); 1,536 positions (about 2 minutes of audio) x 16 slots
= 2.8 GiB; 512 positions (30 s of audio) x 257 slots = 14.7 GiB. A paged cache can replace this when
slots x max_len no longer fits.

Decode (``decode_in_place``) attends over the cache where it lies: with the Triton decode-attention
kernel on CUDA (kernels/decode_attention.py: lengths read on the device, a plan made once per step
for all layers, so it can be captured in a CUDA graph), and elsewhere with SDPA over all ``max_len``
positions under a per-row mask (static shapes: the same graph-shaped code on the CPU).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .layers import SelfAttendingKV


class SlotKVCache:
    def __init__(
        self,
        num_layers: int,
        max_slots: int,
        kv_heads: int,
        max_len: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        shape = (num_layers, max_slots, kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.max_len = max_len
        self._kv_heads = torch.arange(kv_heads, device=device)

    def prefill(self, slots: Tensor, length: int) -> _PrefillView:
        """Write positions [0, length) of these slots; attention sees only the new entries."""
        return _PrefillView(self, slots, length)

    def decode_in_place(self, slots: Tensor, positions: Tensor, use_kernel: bool) -> InPlaceDecodeView:
        """Write one entry per slot at ``positions`` (B,) and attend over each slot's [0, position]
        without gathering: no host-known lengths, static shapes (CUDA-graph safe)."""
        return InPlaceDecodeView(self, slots, positions, use_kernel)


class _PrefillView:
    def __init__(self, cache: SlotKVCache, slots: Tensor, length: int) -> None:
        self.cache, self.slots, self.length = cache, slots, length

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        # k, v: (B, Hkv, T, hd); right-padded rows write garbage past a slot's prompt, which its own
        # next step overwrites before any query can see it (mask: key <= position).
        self.cache.k[layer, :, :, : self.length].index_copy_(0, self.slots, k)
        self.cache.v[layer, :, :, : self.length].index_copy_(0, self.slots, v)
        return k, v


class InPlaceDecodeView(SelfAttendingKV):
    """One query token per row; the attention metadata is planned once here and reused by every layer."""

    def __init__(self, cache: SlotKVCache, slots: Tensor, positions: Tensor, use_kernel: bool) -> None:
        self.cache, self.slots, self.positions = cache, slots, positions
        self.idx = (slots[:, None], cache._kv_heads[None, :], positions[:, None])
        self.use_kernel = use_kernel
        if use_kernel:
            from voicewire.kernels.decode_attention import plan_decode_attention

            kv_heads = cache.k.shape[2]
            # the bound is the cache length, so one captured plan serves every step of a bucket; splits
            # past a row's length read nothing (kernels/decode_attention.py)
            self.plan = plan_decode_attention(
                slots.shape[0], kv_heads, cache.max_len, cache.k.device, cache.k.dtype
            )
            self.slots32 = slots.to(torch.int32)
            self.lengths32 = (positions + 1).to(torch.int32)
        else:
            keys = torch.arange(cache.max_len, device=slots.device)
            self.mask = (keys[None, :] <= positions[:, None])[:, None, None]  # (B, 1, 1, max_len)

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        self.cache.k[layer].index_put_(self.idx, k[:, :, 0])
        self.cache.v[layer].index_put_(self.idx, v[:, :, 0])
        return k, v

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        self.update(layer, k, v)
        kc, vc = self.cache.k[layer], self.cache.v[layer]
        if self.use_kernel:
            from voicewire.kernels.decode_attention import decode_attention

            out = decode_attention(
                q[:, :, 0], kc, vc, self.slots32, self.lengths32, scale=q.shape[-1] ** -0.5, plan=self.plan
            )
            return out[:, :, None]  # (B, H, 1, hd)
        k_all, v_all = kc.index_select(0, self.slots), vc.index_select(0, self.slots)
        return F.scaled_dot_product_attention(
            q, k_all, v_all, attn_mask=self.mask, enable_gqa=q.shape[1] != k_all.shape[1]
        )
