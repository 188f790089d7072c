"""The engine's counters: what metrics endpoints, a core's heartbeat and the benchmarks read."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class EngineStats:
    """Written by the worker only (``voices_cloned`` on the caller's loop); a core sends every field
    but ``batch_sizes`` as a flat list (core/messages.py), so the fields are plain numbers."""

    steps: int = 0
    generate_s: float = 0.0
    decode_s: float = 0.0
    frames_generated: int = 0
    streams_opened: int = 0
    streams_failed: int = 0
    streams_queued: int = 0  # opens that waited for a free stream
    queue_timeouts: int = 0  # ...and failed with server_busy after waiting ``queue_wait_s``
    batch_sizes: Counter[int] = field(default_factory=Counter)
    last_step_s: float = 0.0
    # of generate_s + decode_s, the time the worker was blocked on the model's device
    # (Model.device_wait_s): the rest is host time (Python, launches)
    device_wait_s: float = 0.0
    voices_cloned: int = 0  # clone_voice calls that ran the model's encoders (counted on the caller's loop)
    commands: int = 0  # opens, text pushes, ends and cancels handled by the worker
    commands_s: float = 0.0  # ...and the worker's time in them, between steps
    # the garbage collector's pauses in the engine's process (heap.py), copied each step: every
    # thread of the process stops for them. Collections of every generation since the engine
    # started, their time, the longest pause the process has had, and the longest since the
    # engine turned ready (start-up's collections are no listener's wait)
    gc_collections: int = 0
    gc_pause_s: float = 0.0
    gc_pause_max_s: float = 0.0
    gc_pause_max_since_ready_s: float = 0.0

    def record_step(self, generate_s: float, decode_s: float, batch: int, device_wait_s: float) -> None:
        """One step: its frame-step time, its decode time (overlapped: only the wait for the codec
        after the frame step), its batch size, and the device waits so far."""
        self.steps += 1
        self.generate_s += generate_s
        self.decode_s += decode_s
        self.last_step_s = generate_s + decode_s
        self.device_wait_s = device_wait_s
        self.batch_sizes[batch] += 1
