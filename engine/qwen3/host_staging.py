"""Host->device uploads of one step (or one codec call) through pinned blocks that are reused.

An upload must come from pinned memory to be queued without waiting (from pageable memory torch
first waits for the stream's queued work: the frame steps in flight). ``tensor.pin_memory()`` takes a
block from torch's caching host allocator each time, ~35 us on the device's host for a few bytes,
and a new turn's first step would take eight. Here a step's uploads are packed into one block
kept from earlier steps, each a numpy write and a view; the block goes back to the pool when its
owner has waited for the work that reads it (a step's codes, a codec call's PCM), so no copy can
still be reading it when it is written again. A staging dropped unreleased (a step that failed to
begin, or had no row to decode) leaves its blocks to torch's allocator, which frees them only after
the copies it saw queued from them are done.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

BLOCK_BYTES = 1 << 16  # a step's uploads at 512 rows (its rows, opens, text and table) fit in one
ALIGN_BYTES = 64
KEPT_PER_SIZE = 8  # free blocks kept per size: one per step or codec call in flight, and some spare
NUMPY_DTYPES: dict[torch.dtype, np.dtype] = {
    torch.int64: np.dtype(np.int64),
    torch.int32: np.dtype(np.int32),
    torch.float32: np.dtype(np.float32),
}
TORCH_DTYPES = {v: k for k, v in NUMPY_DTYPES.items()}


class PinnedBlocks:
    """Pinned host blocks by size (powers of two from ``BLOCK_BYTES``), kept for reuse."""

    def __init__(self) -> None:
        self._free: dict[int, list[Tensor]] = {}

    def take(self, nbytes: int) -> Tensor:
        size = max(BLOCK_BYTES, 1 << (max(nbytes, 1) - 1).bit_length())
        free = self._free.get(size)
        return free.pop() if free else torch.empty(size, dtype=torch.uint8, pin_memory=True)

    def give(self, block: Tensor) -> None:
        free = self._free.setdefault(block.numel(), [])
        if len(free) < KEPT_PER_SIZE:
            free.append(block)


class Staging:
    """One owner's uploads: ``put`` and ``copy_into`` pack each into the current block and queue its
    copy; ``release`` once the owner has waited for device work queued after those copies. Off CUDA
    (``blocks`` None) they are plain copies."""

    def __init__(self, blocks: PinnedBlocks | None, device: torch.device) -> None:
        self._blocks, self.device = blocks, device
        self._held: list[Tensor] = []
        self._block: Tensor | None = None
        self._view = np.empty(0, np.uint8)  # the current block as numpy
        self._used = 0

    def put(self, values: np.ndarray | Sequence[object], dtype: torch.dtype) -> Tensor:
        """``values`` on the device, its copy queued (not waited for)."""
        array = np.asarray(values, dtype=NUMPY_DTYPES[dtype])
        if self._blocks is None:
            return torch.from_numpy(array).to(self.device)
        return self.pinned(array).to(self.device, non_blocking=True)

    def copy_into(self, dst: Tensor, values: np.ndarray) -> None:
        """``dst`` (on the device) overwritten with ``values``, queued (a graph's static input)."""
        if self._blocks is None:
            dst.copy_(torch.from_numpy(values))
        else:
            dst.copy_(self.pinned(values), non_blocking=True)

    def pinned(self, array: np.ndarray) -> Tensor:
        """A pinned copy of ``array``, alive until ``release``."""
        assert self._blocks is not None
        n = array.nbytes
        start = -(-self._used // ALIGN_BYTES) * ALIGN_BYTES
        if self._block is None or start + n > self._view.size:
            self._block = self._take(n)
            self._view, start = self._block.numpy(), 0
        self._used = start + n
        self._view[start : start + n] = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        return self._block[start : start + n].view(TORCH_DTYPES[array.dtype]).view(array.shape)

    def release(self) -> None:
        if self._blocks is not None:
            for block in self._held:
                self._blocks.give(block)
        self._held.clear()
        self._block, self._view, self._used = None, np.empty(0, np.uint8), 0

    def _take(self, nbytes: int) -> Tensor:
        assert self._blocks is not None
        block = self._blocks.take(nbytes)
        self._held.append(block)
        return block


def to_device(values: Sequence[object], dtype: torch.dtype, device: torch.device) -> Tensor:
    """A host list as a tensor on ``device``, queued through a pinned block of its own without
    blocking the host (``torch.tensor(values, device=cuda)`` copies from pageable memory: it waits
    for the stream's queued work). For uploads outside a step's or a codec call's ``Staging``."""
    src = torch.tensor(values, dtype=dtype)
    if device.type != "cuda":
        return src
    return src.pin_memory().to(device, non_blocking=True)
