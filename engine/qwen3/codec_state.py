"""Per-stream state of the streaming codec decoder, kept as one flat row per slot on the device.

Every stateful layer of the decoder asks for its state by shape, in forward order, through a
:class:`StateIO`, and hands back its next state the same way. The pool stores each slot's states
concatenated into one row of a (max_slots, N) tensor, so a decode call costs one gather and one
scatter of state, whatever the number of layers (about 40 pieces: conv histories, transposed-conv
overlap frames, K/V of the last window - 1 frames per attention layer). The attention position of
each slot (frames decoded so far) is an int64 row of its own.

Ragged calls: a batch padded to T frames may carry fewer valid frames per row, ``n_valid`` (B,).
Every layer is causal, so the padding frames after a row's valid ones leave its valid output alone;
only the next state must be the state as of the row's last valid frame. ``put`` therefore keeps
the ``width`` steps that end at each row's valid end, found by a device-side gather (no host sync,
static shapes: capturable in a CUDA graph). A layer's time axis runs at its own rate (frames, then
2x, 4x, ... up to 1920 samples per frame); the rate is read off the shapes, so a layer only says
how many steps of state it keeps.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


class StateIO:
    """Hands out per-layer state views of a flat (B, N) state and collects the next state.

    ``flat=None`` hands out zeros (a fresh stream) and only measures N. ``frames`` is the call's T;
    ``n_valid`` (B,) int64, each row's valid frames (1..T; 0 keeps the state), None when all are T.
    ``cudnn_convs``: the call's k > 1 convs on cuDNN even where the conv kernel is prepared.
    """

    def __init__(
        self,
        flat: Tensor | None,
        batch: int,
        dtype: torch.dtype,
        device: torch.device,
        frames: int = 1,
        n_valid: Tensor | None = None,
        cudnn_convs: bool = False,
    ) -> None:
        self.flat, self.batch, self.dtype, self.device = flat, batch, dtype, device
        self.frames, self.n_valid = frames, n_valid
        self.cudnn_convs = cudnn_convs  # a small call's (CodecDecoder.stream decides)
        self.offset = 0
        self.out: list[Tensor] = []
        # (width, steps per frame) -> (B, width) indices of the kept steps; shared by the layers
        # that run at the same rate and keep the same width (planned once per call)
        self._tails: dict[tuple[int, int], Tensor] = {}

    def take(self, *shape: int) -> Tensor:
        n = math.prod(shape)
        if self.flat is None:
            view = torch.zeros(self.batch, *shape, dtype=self.dtype, device=self.device)
        else:
            view = self.flat.narrow(1, self.offset, n).view(self.batch, *shape)
        self.offset += n
        return view

    def put(self, steps: Tensor, width: int, dim: int = -1) -> None:
        """Keep the ``width`` steps of ``steps`` along ``dim`` that end at each row's valid end.

        ``steps`` is [the state taken (width steps), the T frames' new steps (T * rate)] along ``dim``.
        """
        dim = dim % steps.dim()
        length = steps.shape[dim]
        if self.n_valid is None:
            self.out.append(steps.narrow(dim, length - width, width).reshape(self.batch, -1))
            return
        rate, rest = divmod(length - width, self.frames)
        if rest:
            raise RuntimeError(
                f"codec state: {length - width} new steps is not a multiple of {self.frames} frames"
            )
        index = self._tails.get((width, rate))
        if index is None:
            # row b keeps steps [n_b * rate, n_b * rate + width): the last ``width`` before its end
            offsets = torch.arange(width, device=self.device)
            index = self._tails[(width, rate)] = self.n_valid[:, None] * rate + offsets  # (B, width)
        view = [1] * steps.dim()
        view[0], view[dim] = self.batch, width
        shape = list(steps.shape)
        shape[dim] = width
        self.out.append(steps.gather(dim, index.view(view).expand(shape)).reshape(self.batch, -1))

    def put_rows(self, rows: Tensor) -> None:
        """Keep ``rows`` (B, ...) as the next state, already chosen for each row's valid end."""
        self.out.append(rows.reshape(self.batch, -1))

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

    def reset(self, slots: Tensor) -> None:
        """These rows (slots (n,) int64, on the device) back to a fresh stream's state."""
        self.state.index_fill_(0, slots, 0)
        self.positions.index_fill_(0, slots, 0)

    def gather(self, slots: Tensor) -> tuple[Tensor, Tensor]:
        return self.state.index_select(0, slots), self.positions.index_select(0, slots)

    def scatter(self, slots: Tensor, state: Tensor, positions: Tensor) -> None:
        self.state.index_copy_(0, slots, state)
        self.positions.index_copy_(0, slots, positions)
