"""What the worker hands to the streams' event loops (audio chunks, failures), posted per loop.

Each ``loop.call_soon_threadsafe`` writes a byte to the loop's self-pipe: ~20 µs of the worker's
time with the interpreter lock held, per call. A piece of codec work hands out a chunk to each of
its streams (tens a tick at load), so inside ``batch()`` the calls collect and go out as one call
per loop when the batch ends, run on the loop in the order they were posted. Outside a batch a
call goes at once. Owned by the worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

log = logging.getLogger("voicewire.engine")

Call = tuple[Callable[[Any], None], Any]


class Outbox:
    def __init__(self, lost: Callable[[Any], None]) -> None:
        self._lost = lost  # the owner of each call whose loop was closed under us
        self._depth = 0
        self._pending: dict[asyncio.AbstractEventLoop, tuple[list[Any], list[Call]]] = {}

    def post(self, loop: asyncio.AbstractEventLoop, owner: Any, fn: Callable[[Any], None], arg: Any) -> None:
        """``fn(arg)`` on ``loop``; ``owner`` goes to ``lost`` if the loop is closed."""
        if not self._depth:
            self._send(loop, [owner], [(fn, arg)])
            return
        owners, calls = self._pending.setdefault(loop, ([], []))
        owners.append(owner)
        calls.append((fn, arg))

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """The calls posted inside go out when the outermost batch ends."""
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if not self._depth:
                self._flush()

    def _flush(self) -> None:
        pending, self._pending = self._pending, {}
        for loop, (owners, calls) in pending.items():
            self._send(loop, owners, calls)

    def _send(self, loop: asyncio.AbstractEventLoop, owners: list[Any], calls: list[Call]) -> None:
        try:
            if len(calls) == 1:
                fn, arg = calls[0]
                loop.call_soon_threadsafe(fn, arg)
            else:
                loop.call_soon_threadsafe(_run_all, calls)
        except RuntimeError:  # the loop was closed under us (its owner went away without cancelling)
            for owner in owners:
                self._lost(owner)


def _run_all(calls: list[Call]) -> None:
    """On the loop: each call in order, as separate callbacks would run (one's error spares the rest)."""
    for fn, arg in calls:
        try:
            fn(arg)
        except Exception:
            log.exception("stream callback %r failed", fn)
