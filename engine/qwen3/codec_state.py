"""Per-stream state of the streaming codec decoder, kept as one flat row per slot on the device.

Every stateful layer of the decoder asks for its state by shape, in forward order, through a
:class:`StateIO`, and hands back its next state the same way. The pool stores each slot's states
concatenated into one row of a (max_slots, N) tensor, so a decode call costs one gather and one
scatter of state, whatever the number of layers (about 40 pieces: conv histories, transposed-conv
overlap frames, K/V of the last window - 1 frames per attention layer). The attention position of
each slot (frames decoded so far) is an int64 row of its own.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


class StateIO:
    """Hands out per-layer state views of a flat (B, N) state and collects the next state.

    ``flat=None`` hands out zeros (a fresh stream) and only measures N.
    """

    def __init__(self, flat: Tensor | None, batch: int, dtype: torch.dtype, device: torch.device) -> None:
        self.flat, self.batch, self.dtype, self.device = flat, batch, dtype, device
        self.offset = 0
        self.out: list[Tensor] = []

    def take(self, *shape: int) -> Tensor:
        n = math.prod(shape)
        if self.flat is None:
            view = torch.zeros(self.batch, *shape, dtype=self.dtype, device=self.device)
        else:
            view = self.flat.narrow(1, self.offset, n).view(self.batch, *shape)
        self.offset += n
        return view

    def put(self, state: Tensor) -> None:
        self.out.append(state.reshape(self.batch, -1))

    def next_flat(self) -> Tensor:
        """(B, N) next state; checks every piece taken was put back with the same size."""
        flat = (
            torch.cat(self.out, dim=1)
            if self.out
            else torch.zeros(self.batch, 0, dtype=self.dtype, device=self.device)
        )
        if flat.shape[1] != self.offset:
            raise RuntimeError(f"codec state mismatch: took {self.offset} values, put back {flat.shape[1]}")
        return flat


class CodecStatePool:
    """(max_slots, N) decoder state + (max_slots,) frame positions, indexed by slot."""

    def __init__(self, max_slots: int, width: int, dtype: torch.dtype, device: torch.device) -> None:
        self.state = torch.zeros(max_slots, width, dtype=dtype, device=device)
        self.positions = torch.zeros(max_slots, dtype=torch.int64, device=device)

    def reset(self, slot: int) -> None:
        self.state[slot].zero_()
        self.positions[slot] = 0

    def gather(self, slots: Tensor) -> tuple[Tensor, Tensor]:
        return self.state.index_select(0, slots), self.positions.index_select(0, slots)

    def scatter(self, slots: Tensor, state: Tensor, positions: Tensor) -> None:
        self.state.index_copy_(0, slots, state)
        self.positions.index_copy_(0, slots, positions)
