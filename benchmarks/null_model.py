"""A model that makes frames for free: what the engine's own host work can reach (host_overhead.py),
and the base of the simulated H200 (simulated_h200.py)."""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from voicewire.engine.model import (
    DecodeWork,
    GenerateResult,
    Model,
    ModelInfo,
    StreamParams,
    TextGranularity,
)

FRAME_SAMPLES = 1920


class NullModel(Model):
    """Frames for free: one (1, 16) payload per ready slot per step, silence per decoded frame."""

    def __init__(self, max_slots: int, max_batch: int, step_s: float = 0.0, row_s: float = 0.0) -> None:
        self.step_s, self.row_s = step_s, row_s
        self.info = ModelInfo(
            name="null",
            sample_rate_hz=24_000,
            frame_samples=FRAME_SAMPLES,
            text_granularity=TextGranularity.WORD,
            max_batch_size=max_batch,
            max_slots=max_slots,
            voices=("null",),
            random_weights=True,
        )
        self._left: dict[int, int] = {}
        self._final: dict[int, bool] = {}
        self._codes = np.zeros((1, 16), np.int64)

    def open_slot(self, slot: int, params: StreamParams) -> None:
        self._left[slot] = params.forced_frames or 1
        self._final[slot] = False

    def add_text(self, slot: int, pieces: Sequence[str], final: bool) -> None:
        self._final[slot] = self._final[slot] or final

    def ready(self, slot: int) -> bool:
        return self._final.get(slot, False) and self._left.get(slot, 0) > 0

    def generate(self, slots: Sequence[int]) -> list[GenerateResult]:
        if self.step_s or self.row_s:
            time.sleep(self.step_s + self.row_s * len(slots))  # the device's step, the lock released
        out = []
        for s in slots:
            self._left[s] -= 1
            out.append(GenerateResult(s, self._codes, 1, self._left[s] == 0))
        return out

    def decode(self, work: Sequence[DecodeWork]) -> list[np.ndarray]:
        return [np.zeros(w.n_frames * FRAME_SAMPLES, np.float32) for w in work]

    def close_slot(self, slot: int) -> None:
        self._left.pop(slot, None)
        self._final.pop(slot, None)
