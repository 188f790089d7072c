"""The worker's inbox: the commands the callers' loops post (``Engine.open_stream``, each stream's
text, ends and cancels, ``Engine.close``), through one thread-safe queue, so the worker sees every
stream's commands in the order they were posted. Taken between steps, for up to a time budget: a
flood of text must not hold back the next frame step."""

from __future__ import annotations

import queue
import time
from collections.abc import Callable
from typing import TypeAlias

from .commands import Stop, StreamCommand
from .live import OpenStream

Command: TypeAlias = OpenStream | StreamCommand | Stop


class Inbox:
    def __init__(self, budget_s: float) -> None:
        self._queue: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._budget_s = budget_s  # the worker's time for commands between two steps

    def put(self, cmd: Command) -> None:
        """Any thread."""
        self._queue.put(cmd)

    def drain(self, handle: Callable[[Command], None], wait_s: float | None) -> tuple[int, float]:
        """Hands the commands that came in to ``handle``, waiting up to ``wait_s`` for the first
        (None: no wait), until the budget is spent; returns (commands handled, seconds spent)."""
        try:
            cmd = self._queue.get_nowait() if wait_s is None else self._queue.get(timeout=wait_s)
        except queue.Empty:
            return 0, 0.0
        t0, n = time.perf_counter(), 0
        while True:
            handle(cmd)
            n += 1
            if time.perf_counter() - t0 > self._budget_s:
                break
            try:
                cmd = self._queue.get_nowait()
            except queue.Empty:
                break
        return n, time.perf_counter() - t0
