"""Runaway guards: a stream whose model never samples EOS, or loops, ends as if it had stopped.

Real checkpoints sometimes never emit codec EOS, or fall into a loop: the same frame again and
again, or a short cycle of frames, for tens of seconds. Three stops, each an ordinary end of
stream whose ``GenerateResult.stop_reason`` is ``"length"`` (the gateway's ``turn.done`` reason):

1. a frame budget from the text, once all of it has arrived:
   ``max(min_frames, frames_per_token * text tokens)``. Generous on purpose, since a tight budget
   cuts off slow, expressive speech: read English runs at ~3-4 frames (80 ms each) per text token,
   so 8 frames a token lets speech run at half speed with pauses; the floor of 6 s covers a
   one-token text ("1次") said slowly.
2. a repetition detector on codebook 0: the last ``repeat_frames`` frames are one pattern of at
   most ``MAX_PERIOD_FRAMES`` frames repeated (4 s by default: longer than any pause inside a
   sentence, far shorter than the 10-36 s loops seen on real checkpoints).
3. the hard caps of the model (``max_seq_len``, the checkpoint's ``max_new_tokens``: model.py).

The detector runs on the host copy of the codes the step makes anyway, as a few numpy operations
over the whole batch: per frame and row it keeps, for each period p, how many frames in a row
equalled the frame p before them. A pattern of period p has repeated over the last W frames when
that run is at least W - p.

Per request, ``StreamParams.extra`` overrides the limits: ``min_frames``, ``frames_per_token``
and ``repeat_frames`` (0 turns the detector off). A stream of forced length (random weights,
``StreamParams.forced_frames``) has no guards: it stops where it was told to.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

MIN_FRAMES = 75  # 6 s at 12.5 frames/s
FRAMES_PER_TOKEN = 8.0  # 0.64 s per text token
REPEAT_FRAMES = 50  # 4 s of one repeated pattern
MAX_PERIOD_FRAMES = 16  # the longest cycle the detector sees: 1.28 s


@dataclass(frozen=True)
class GuardLimits:
    """One stream's limits (module docstring)."""

    min_frames: int = MIN_FRAMES
    frames_per_token: float = FRAMES_PER_TOKEN
    repeat_frames: int = REPEAT_FRAMES  # 0 = no repetition detector

    def __post_init__(self) -> None:
        if self.min_frames < 1:
            raise ValueError("min_frames must be >= 1")
        if not self.frames_per_token > 0:
            raise ValueError("frames_per_token must be > 0")
        if self.repeat_frames and self.repeat_frames < 2 * MAX_PERIOD_FRAMES:
            # below it a pattern of the longest period would count after one showing
            raise ValueError(f"repeat_frames must be 0 or >= {2 * MAX_PERIOD_FRAMES}")

    @classmethod
    def from_extra(cls, extra: Mapping[str, object]) -> GuardLimits:
        """The defaults with a request's overrides; ValueError for a bad value."""
        try:
            return cls(
                min_frames=int(extra.get("min_frames", MIN_FRAMES)),  # type: ignore[call-overload]
                frames_per_token=float(extra.get("frames_per_token", FRAMES_PER_TOKEN)),  # type: ignore[arg-type]
                repeat_frames=int(extra.get("repeat_frames", REPEAT_FRAMES)),  # type: ignore[call-overload]
            )
        except (TypeError, ValueError) as err:
            raise ValueError(f"bad runaway-guard limit: {err}") from None

    def frame_budget(self, text_tokens: int) -> int:
        """Most frames a stream of ``text_tokens`` tokens (all of its text) may make."""
        return max(self.min_frames, math.ceil(self.frames_per_token * text_tokens))


class RepetitionDetector:
    """Codebook-0 loops of every slot, as rows of host arrays indexed by slot."""

    def __init__(self, rows: int, max_period: int = MAX_PERIOD_FRAMES) -> None:
        self.history = np.full((rows, max_period), -1, np.int64)  # [:, j] = code 0 of frame t-1-j
        self.runs = np.zeros((rows, max_period), np.int64)  # [:, p-1]: frames in a row equal to frame -p
        self.repeat_frames = np.zeros(rows, np.int64)  # per row; 0 = off
        self._periods = np.arange(1, max_period + 1)

    def open(self, slot: int, repeat_frames: int) -> None:
        self.history[slot] = -1
        self.runs[slot] = 0
        self.repeat_frames[slot] = repeat_frames

    def push(self, slots: np.ndarray, code0: np.ndarray) -> np.ndarray:
        """The next frame's codebook-0 code of each slot: (B,), (B,) -> (B,) bool, the slot loops."""
        history = self.history[slots]  # (B, P)
        runs = np.where(history == code0[:, None], self.runs[slots] + 1, 0)
        self.runs[slots] = runs
        self.history[slots] = np.concatenate([code0[:, None], history[:, :-1]], axis=1)
        need = self.repeat_frames[slots]
        looped: np.ndarray = (need > 0) & (runs + self._periods >= need[:, None]).any(axis=1)
        return looped
