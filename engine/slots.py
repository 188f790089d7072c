"""The model's slots on the engine's side: which are free, and when a released one comes back.

A slot released while a frame step the device is running (or has queued) still uses it
(``Model.generate_start``) stays taken until the results of every such step are in: until then the
model must not close it, and no new stream may get it. Plain Python, owned by the worker thread.

Free slots are handed out longest free first. A stream cut short (a barge-in) gives its slot back
while a codec call of its last chunks may still be running on the device; a new owner's first chunk
must follow that call (its decoder state is reset after it), and on Qwen3-TTS the reset waits on the
codec's urgent lane, where every new stream's first chunk runs (engine/qwen3/codec_runner.py). Taking
the slot freed longest ago makes that wait all but never happen while slots are to spare.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable


class SlotPool:
    def __init__(self, n: int = 0) -> None:
        self._free = deque(range(n))  # taken from the left (slot 0 first), given back on the right
        self._stepping: deque[frozenset[int]] = deque()  # the slots of each begun step, oldest first
        self._after_step: list[int] = []

    def __bool__(self) -> bool:
        """A slot is free now."""
        return bool(self._free)

    def take(self) -> int:
        return self._free.popleft()

    def put(self, slot: int) -> None:
        """The slot is free again (closed in the model, or never opened there)."""
        self._free.append(slot)

    def release(self, slot: int) -> bool:
        """The slot's stream is gone: True when the caller may close it and ``put`` it back now; False
        when a begun step still uses it, and ``step_done`` hands it back."""
        if any(slot in step for step in self._stepping):
            self._after_step.append(slot)
            return False
        return True

    def step_started(self, slots: Iterable[int]) -> None:
        self._stepping.append(frozenset(slots))

    def step_done(self) -> list[int]:
        """The oldest begun step's results are in: the slots released meanwhile that no other begun
        step uses, for the caller to close and put back."""
        self._stepping.popleft()
        out = [s for s in self._after_step if not any(s in step for step in self._stepping)]
        self._after_step = [s for s in self._after_step if s not in out]
        return out
