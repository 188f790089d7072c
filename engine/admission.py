"""Who gets a stream: the count the callers see, and the opens that wait for a free stream.

``Engine.open_stream`` runs on the callers' loops and counts the streams opened and not yet
finished, under a lock: past ``limit + max_queued`` it refuses at once (``EngineBusy``). The worker
opens a stream when one of the ``limit`` is free and so is a model slot (one released during a frame
step comes back after it, slots.py) and, for a model with a KV block pool, the blocks it needs to get
going (``kv_admits``); until then the open waits in the queue, oldest first, with the
commands its caller posts meanwhile, and fails with ``server_busy`` at its deadline.
"""

from __future__ import annotations

import contextlib
import threading

from .live import OpenQueue, OpenStream, WaitingOpen
from .model import KVRoom
from .stream import StreamError


class EngineBusy(Exception):
    """No capacity for another stream (``max_streams`` or model slots)."""


def kv_admits(room: KVRoom | None, live_streams: int) -> bool:
    """A new stream gets going while the pool keeps its first blocks and one more for each live
    stream's next growth: a stream that finds no block ends with an error, so admission, not the
    pool running dry, is where a full engine says no."""
    return room is None or room.free_blocks >= room.new_stream_blocks + live_streams


class Admission:
    def __init__(self) -> None:
        self._count = 0  # streams opened and not yet finished, counted on the caller side
        self._lock = threading.Lock()  # open_stream runs on any caller's loop, the worker finishes
        self.waiting = OpenQueue()  # worker side only

    @property
    def count(self) -> int:
        return self._count

    def reserve(self, limit: int, max_queued: int) -> None:
        """Counts a new stream; raises EngineBusy when ``limit`` run and ``max_queued`` wait."""
        with self._lock:
            if self._count >= limit + max_queued:
                raise EngineBusy(
                    f"engine is at its limit of {limit} streams"
                    + (f" and {max_queued} waiting" if max_queued else "")
                )
            self._count += 1

    def finish(self) -> None:
        """A counted stream is done (finished, failed, cancelled while waiting, or never opened)."""
        with self._lock:
            self._count -= 1

    def expired(self, now: float) -> list[WaitingOpen]:
        """The waiting opens past their deadline, removed and no longer counted."""
        out = self.waiting.expired(now)
        for _ in out:
            self.finish()
        return out


def tell(open: OpenStream, err: StreamError) -> None:
    """Fails an open that never ran, on its caller's loop."""
    with contextlib.suppress(RuntimeError):  # its caller's loop is gone: nobody to tell
        open.stream.loop.call_soon_threadsafe(open.stream.fail, err)
