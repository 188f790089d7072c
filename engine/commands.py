"""What the event-loop side posts to the engine's worker thread: one frozen record per command.

A ``Stream`` posts the four stream commands; ``Engine.close`` posts ``Stop``. They travel through
one thread-safe queue, so the worker sees every stream's commands in the order they were posted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias


@dataclass(frozen=True)
class PushText:
    """More text for a stream (a non-empty delta)."""

    stream_id: int
    delta: str


@dataclass(frozen=True)
class Flush:
    """Speak what is buffered now, without waiting for a clause boundary."""

    stream_id: int


@dataclass(frozen=True)
class End:
    """No more text for this stream: flush, and finish after the last audio."""

    stream_id: int


@dataclass(frozen=True)
class Cancel:
    """Barge-in: drop the stream and free its slot."""

    stream_id: int


@dataclass(frozen=True)
class Stop:
    """The worker finishes every stream with ``engine_closed`` and exits."""


StreamCommand: TypeAlias = PushText | Flush | End | Cancel
