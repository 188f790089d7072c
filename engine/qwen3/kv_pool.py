"""The host side of the paged KV cache: which blocks of the pool each slot owns, and a mirror of the
block table the kernels read on the device (kv_cache.py). Plain Python and numpy: no torch.

``ensure(slot, positions)`` takes blocks from the free list for a slot's first positions (at its
open: those of a new stream, NEW_STREAM_POSITIONS) and as its stream grows (one per PAGE positions);
``release(slot)`` gives them all back when it closes.
Block ``SCRATCH_BLOCK`` is never handed out: every table entry no block is assigned to points at
it, so the rows of a graph bucket that no stream uses (the padding slot, whose whole row is
scratch), and a right-padded prefill's positions past a slot's blocks, write there harmlessly and
nothing reads it. A block handed to a new owner needs no clearing: attention admits only keys at
positions <= the query's (``key <= position``), and each of those the owner wrote itself first.

Changes to the table collect as dirty entries and go to the device in one copy per step
(``take_writes``, then ``SlotState.flush`` with the step's other writes).
"""

from __future__ import annotations

import numpy as np

# Positions per block. 64 = the decode-attention kernel's bf16 key tile (kernels/decode_attention.py
# DEFAULT_BLOCK_N): a tile lies in one page, so the kernel reads one block id per tile. A block is
# 28 layers x 8 KV heads x 64 x 128 x 2 (K, V) x 2 bytes = 7 MiB on the 1.7B talker in bf16 (the
# 0.6B has the same KV heads); a 4-s reply (~60 positions with its prompt) fits in one or two, where
# a slot-contiguous row of 1,536 positions reserved 168 MiB.
PAGE = 64
SCRATCH_BLOCK = 0  # never owned: the target of every unassigned table entry
# A new stream's first positions: its prompt (~12 positions, more with a long instruction) and ~4 s
# of frames at 12.5 Hz: what admission should see free before it opens another stream.
NEW_STREAM_POSITIONS = 16 + 50


def blocks_for(positions: int, page: int = PAGE) -> int:
    """Blocks of ``page`` positions that hold ``positions`` positions."""
    return -(-positions // page)


class KVPool:
    """Blocks 1 .. num_blocks - 1 for rows 0 .. max_slots - 1; row max_slots is the padding slot.
    ``page``: positions per block (PAGE; a page of max_positions is the slot-contiguous layout)."""

    def __init__(self, num_blocks: int, max_slots: int, max_positions: int, page: int = PAGE) -> None:
        if num_blocks < 2:
            raise ValueError(f"a pool needs the scratch block and one more, got {num_blocks} blocks")
        self.num_blocks, self.page = num_blocks, page
        self.max_blocks_per_slot = blocks_for(max_positions, page)
        # host mirror of the device table: (max_slots + 1, max_blocks_per_slot) int32, all scratch
        self.table = np.full((max_slots + 1, self.max_blocks_per_slot), SCRATCH_BLOCK, np.int32)
        # a stack: the most recently freed block is handed out first (still warm in L2, for what it's worth)
        self._free = list(range(num_blocks - 1, SCRATCH_BLOCK, -1))
        self._owned: list[list[int]] = [[] for _ in range(max_slots)]
        self._writes: dict[int, int] = {}  # flat table index -> block, since the last take_writes

    @property
    def free_blocks(self) -> int:
        return len(self._free)

    @property
    def usable_blocks(self) -> int:
        """The pool less the scratch block."""
        return self.num_blocks - 1

    def owned(self, slot: int) -> int:
        return len(self._owned[slot])

    def ensure(self, slot: int, positions: int) -> bool:
        """Give ``slot`` the blocks for its first ``positions`` positions. False (and nothing taken)
        when the pool has too few free blocks; a slot past max_positions is the caller's bug."""
        owned = self._owned[slot]
        need = -(-positions // self.page) - len(owned)  # blocks_for, inline: every slot, every step
        if need <= 0:
            return True
        if need > len(self._free):
            return False
        if len(owned) + need > self.max_blocks_per_slot:
            raise ValueError(
                f"slot {slot}: {positions} positions > the table's {self.max_blocks_per_slot} blocks"
            )
        width = self.max_blocks_per_slot
        for _ in range(need):
            block = self._free.pop()
            self._writes[slot * width + len(owned)] = block
            self.table[slot, len(owned)] = block
            owned.append(block)
        return True

    def release(self, slot: int) -> None:
        """All of ``slot``'s blocks back to the free list; its table row back to scratch."""
        owned = self._owned[slot]
        width = self.max_blocks_per_slot
        for i in range(len(owned)):
            self._writes[slot * width + i] = SCRATCH_BLOCK
        self.table[slot, : len(owned)] = SCRATCH_BLOCK
        self._free.extend(reversed(owned))
        owned.clear()

    def take_writes(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The table entries changed since the last call, as (flat indices, blocks) int32 arrays
        (None when there are none); the caller copies them to the device in one go."""
        if not self._writes:
            return None
        at = np.fromiter(self._writes.keys(), np.int32, len(self._writes))
        blocks = np.fromiter(self._writes.values(), np.int32, len(self._writes))
        self._writes = {}
        return at, blocks
