"""The talker's KV cache: a pool of fixed-size blocks, addressed per slot through a block table.

    k, v         (layers, num_blocks, kv_heads, PAGE, head_dim)   PAGE = 64 positions (kv_pool.py)
    block_table  (max_slots + 1, max_blocks) int32 on the device  position p of slot s lives at block
                                                                  block_table[s, p // PAGE], offset p % PAGE

Which blocks a slot owns is decided on the host (``KVPool``, kv_pool.py: a free list, blocks taken as
a stream grows, all returned when it closes); the host mirror's changes reach the device table in one
copy per step, with the step's other writes (``SlotState.flush``). Nothing is allocated per request,
so opening and closing streams cannot leak, and a reused block needs no clearing: the attention mask only admits positions a stream has
written itself (``key <= position``), and every position is written before it is read. Entries no
block is assigned to point at the scratch block 0: the graphs' padding slot (whose whole row is
scratch) and right-padded prefill positions write there, and nothing reads it.

Memory: 28 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes = 112 KiB per position in bf16 (either
size: both talkers have 8x128 KV heads), 7 MiB per 64-position block; a stream holds what it has
spoken, ceil(positions / 64) blocks, instead of a 1,536-position row (168 MiB) from the start.

Prompt prefixes (prefix_cache.py): the KV of up to ``PREFIX_POSITIONS`` first positions of a few
prompts, kept apart from the pool (``prefix_k``, ``prefix_v``; entry 0 is scratch, for the padding
rows). ``save_prefix`` copies a prefilled slot's into an entry, ``load_prefix`` an entry into new
slots' first blocks: what their prefill would have written there, without the talker.

Decode (``decode_in_place``) attends over the blocks where they lie: with the Triton decode-attention
kernel on CUDA (kernels/decode_attention.py: lengths and the table read on the device, a plan made once
per step for all layers, so it can be captured in a CUDA graph), and elsewhere with SDPA over each
slot's ``max_blocks x PAGE`` positions gathered through the table under a per-row mask (static shapes:
the same graph-shaped code on the CPU).
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import Tensor

from ..model import KVRoom
from .kv_pool import NEW_STREAM_POSITIONS, PAGE, KVPool, blocks_for
from .layers import SelfAttendingKV

log = logging.getLogger("voicewire.qwen3")

PREFIX_POSITIONS = 16  # a kept prefix's positions at most: the default prompt's head is ~10


class PagedKVCache:
    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        max_slots: int,
        kv_heads: int,
        max_len: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
        page: int = PAGE,
        prefixes: int = 0,
    ) -> None:
        """``max_slots`` stream rows (the padding slot's row comes on top); ``max_len`` positions per
        stream at most; ``num_blocks`` blocks of ``page`` positions, the scratch block included;
        ``prefixes`` kept prompt prefixes."""
        self.pool = KVPool(num_blocks, max_slots, max_len, page)
        self.page = page
        shape = (num_layers, num_blocks, kv_heads, page, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.prefix_len = min(PREFIX_POSITIONS, page)
        kept = (num_layers, prefixes + 1, kv_heads, self.prefix_len, head_dim)
        self.prefix_k = torch.zeros(kept, dtype=dtype, device=device)
        self.prefix_v = torch.zeros(kept, dtype=dtype, device=device)
        self.block_table = torch.from_numpy(self.pool.table.copy()).to(device)  # all scratch
        self.max_blocks = self.pool.max_blocks_per_slot
        self.max_len = self.max_blocks * page  # positions a table row addresses (>= the stream cap)
        self._kv_heads = torch.arange(kv_heads, device=device)
        log.info(
            "KV pool: %d blocks of %d positions (%.2f GiB, %d positions) for %d slots of up to %d",
            num_blocks - 1,
            page,
            num_blocks * self.block_bytes / (1 << 30),
            (num_blocks - 1) * page,
            max_slots,
            max_len,
        )

    @property
    def block_bytes(self) -> int:
        """Device bytes of one block, K and V of every layer."""
        return 2 * self.k[:, 0].numel() * self.k.element_size()

    def grow(self, positions: dict[int, int]) -> dict[int, str]:
        """Blocks for each slot's first ``positions[slot]`` positions (what a step is about to write;
        the table's changes go up with the step's other writes, ``SlotState.flush``). Returns the
        slots the pool could not grow, each with its error: the caller ends those streams (their
        blocks stay theirs until close) and steps the others."""
        ensure = self.pool.ensure
        full = {
            s: f"KV cache full: no free block for position {n - 1} ({self.pool.usable_blocks} blocks of "
            f"{self.page} positions, all held by open streams)"
            for s, n in positions.items()
            if not ensure(s, n)
        }
        return full

    def open(self, slot: int) -> None:
        """A new stream's first blocks, taken at its open (flushed with the next step's): admission
        counted them free (``room``), so streams opened in one pass of the worker cannot each count
        the same blocks. Nothing is taken when the pool is short; the stream's growth then decides."""
        self.pool.ensure(slot, min(NEW_STREAM_POSITIONS, self.pool.max_blocks_per_slot * self.page))

    def room(self) -> KVRoom:
        pool = self.pool
        return KVRoom(
            pool.free_blocks, pool.usable_blocks, self.page, blocks_for(NEW_STREAM_POSITIONS, self.page)
        )

    def save_prefix(self, entry: int, slot: int) -> None:
        """The first ``prefix_len`` positions of ``slot`` (prefilled, queued before this) into ``entry``."""
        block, n = int(self.pool.table[slot, 0]), self.prefix_len
        self.prefix_k[:, entry] = self.k[:, block, :, :n]
        self.prefix_v[:, entry] = self.v[:, block, :, :n]

    def load_prefix(self, slots: Tensor, entries: Tensor) -> None:
        """Each entry's positions into its slot's first block (graph-capturable): positions past
        the prefix come along as garbage, which the slot's own steps write before any query reads."""
        blocks, n = self.block_table[slots, 0].long(), self.prefix_len
        self.k[:, blocks, :, :n] = self.prefix_k[:, entries]
        self.v[:, blocks, :, :n] = self.prefix_v[:, entries]

    def prefill(self, slots: Tensor, length: int) -> _PrefillView:
        """Write positions [0, length) of these slots; attention sees only the new entries."""
        return _PrefillView(self, slots, length)

    def decode_in_place(self, slots: Tensor, positions: Tensor, use_kernel: bool) -> InPlaceDecodeView:
        """Write one entry per slot at ``positions`` (B,) and attend over each slot's [0, position]
        without host-known lengths: static shapes (CUDA-graph safe)."""
        return InPlaceDecodeView(self, slots, positions, use_kernel)

    def _where(self, slots: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Index of (slot, position) pairs into a layer's (num_blocks, Hkv, PAGE, D): slots (B,),
        positions (B, T) -> (blocks, heads, offsets) broadcasting to (B, Hkv, T)."""
        blocks = self.block_table[slots[:, None], positions // self.page]  # (B, T)
        return blocks[:, None, :], self._kv_heads[None, :, None], (positions % self.page)[:, None, :]

    def gather(self, layer: int, slots: Tensor) -> tuple[Tensor, Tensor]:
        """K and V of these slots' whole table rows, (B, Hkv, max_blocks x PAGE, D), in position order."""
        table = self.block_table[slots]  # (B, max_blocks)

        def rows(cache: Tensor) -> Tensor:
            pages = cache[layer][table]  # (B, max_blocks, Hkv, PAGE, D)
            return pages.transpose(1, 2).flatten(2, 3)

        return rows(self.k), rows(self.v)


class _PrefillView:
    def __init__(self, cache: PagedKVCache, slots: Tensor, length: int) -> None:
        positions = torch.arange(length, device=slots.device).expand(slots.shape[0], length)
        self.cache, self.idx = cache, cache._where(slots, positions)

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        # k, v: (B, Hkv, T, hd); right-padded rows write garbage past a slot's prompt, which its own
        # next step overwrites before any query can see it (mask: key <= position), or into the
        # scratch block past the slot's blocks.
        self.cache.k[layer].index_put_(self.idx, k)
        self.cache.v[layer].index_put_(self.idx, v)
        return k, v


class InPlaceDecodeView(SelfAttendingKV):
    """One query token per row; the attention metadata is planned once here and reused by every layer."""

    def __init__(self, cache: PagedKVCache, slots: Tensor, positions: Tensor, use_kernel: bool) -> None:
        self.cache, self.slots, self.positions = cache, slots, positions
        self.idx = cache._where(slots, positions[:, None])
        self.use_kernel = use_kernel
        if use_kernel:
            from voicewire.kernels.decode_attention_plan import plan_decode_attention

            kv_heads = cache.k.shape[2]
            # the bound is a table row's length, so one captured plan serves every step of a bucket;
            # splits past a row's length read nothing (kernels/decode_attention.py)
            self.plan = plan_decode_attention(
                slots.shape[0], kv_heads, cache.max_len, cache.k.device, cache.k.dtype
            )
            self.slots32 = slots.to(torch.int32)
            self.lengths32 = (positions + 1).to(torch.int32)
        else:
            keys = torch.arange(cache.max_len, device=slots.device)
            self.mask = (keys[None, :] <= positions[:, None])[:, None, None]  # (B, 1, 1, max_len)

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        self.cache.k[layer].index_put_(self.idx, k)  # k (B, Hkv, 1, hd)
        self.cache.v[layer].index_put_(self.idx, v)
        return k, v

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        self.update(layer, k, v)
        if self.use_kernel:
            from voicewire.kernels.decode_attention import decode_attention

            kc, vc = self.cache.k[layer], self.cache.v[layer]
            out = decode_attention(
                q[:, :, 0],
                kc,
                vc,
                self.slots32,
                self.lengths32,
                block_table=self.cache.block_table,
                scale=q.shape[-1] ** -0.5,
                plan=self.plan,
            )
            return out[:, :, None]  # (B, H, 1, hd)
        k_all, v_all = self.cache.gather(layer, self.slots)
        return F.scaled_dot_product_attention(
            q, k_all, v_all, attn_mask=self.mask, enable_gqa=q.shape[1] != k_all.shape[1]
        )
