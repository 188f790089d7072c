"""The frame step's one device->host copy: the (B, 16) sampled codes, through pinned memory.

The copy is queued behind the step without waiting (a copy to pageable memory would block the host
until the device ran dry); waiting for it is the only time the worker waits on a frame step. The
pinned buffers are kept and reused: one is out per step in flight (Model.steps_in_flight), and it
comes back once its codes are copied out, so a step allocates no pinned memory.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from torch import Tensor

from ..model import Queued


class CodesToHost:
    def __init__(self, max_rows: int, width: int) -> None:
        self._shape = (max_rows, width)
        self._free: list[Tensor] = []  # pinned (max_rows, width) int64 buffers not in use
        self.wait_s = 0.0  # the caller blocked waiting for codes (Model.device_wait_s)

    def start(self, codes: Tensor) -> Queued[np.ndarray]:
        """``codes`` (B, width) int64 queued for the host; calling the result waits for them and
        returns an array of the caller's own."""
        if codes.device.type != "cuda":
            return Queued.finished(codes.numpy())
        if codes.dtype != torch.int64 or codes.shape[0] > self._shape[0]:
            raise ValueError(f"codes {codes.dtype} {tuple(codes.shape)}: int64 of at most {self._shape[0]} rows")
        buf = self._free.pop() if self._free else torch.empty(self._shape, dtype=torch.int64, pin_memory=True)
        host = buf[: codes.shape[0]]
        host.copy_(codes, non_blocking=True)
        done = torch.cuda.Event()
        done.record()

        def wait() -> np.ndarray:
            t0 = time.perf_counter()
            done.synchronize()
            self.wait_s += time.perf_counter() - t0
            out = host.numpy().copy()  # the rows outlive the step (GenerateResult.frames)
            self._free.append(buf)
            return out

        return Queued(wait, done.query)
