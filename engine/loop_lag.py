"""How late an asyncio loop runs what is due: a task that sleeps a tick and measures how much it
overslept. A loop held by one callback, a full garbage collection or a CPU it shares is late for
everything it serves at once: a gateway for every session's audio, a load client for every
arrival it timestamps (a client's own stall is not the server's underrun).

The gateway reports it on /metrics and the probe in its summary; both sides import it from here
(the client side never imports the server's)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from dataclasses import dataclass

TICK_S = 0.005
STALL_S = 0.02  # a lag this long is a stall: two 10-ms audio windows a listener may miss


@dataclass(frozen=True)
class Stall:
    t_end: float  # perf_counter when the loop ran again
    seconds: float


class LoopLag:
    def __init__(self, tick_s: float = TICK_S, stall_s: float = STALL_S, keep: int = 4096) -> None:
        self.tick_s, self.stall_s = tick_s, stall_s
        self.max_s = 0.0
        self.max_since_mark_s = 0.0
        self.stalls = 0
        self.recent: deque[Stall] = deque(maxlen=keep)  # the latest stalls
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Watch the running loop (until ``stop``)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._watch(), name="loop-lag")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def mark(self) -> None:
        self.max_since_mark_s = 0.0

    def between(self, t0: float, t1: float) -> list[Stall]:
        """The kept stalls that overlapped ``t0 .. t1`` (perf_counter)."""
        return [s for s in list(self.recent) if s.t_end >= t0 and s.t_end - s.seconds <= t1]

    async def _watch(self) -> None:
        while True:
            t0 = time.perf_counter()
            await asyncio.sleep(self.tick_s)
            t = time.perf_counter()
            lag = t - t0 - self.tick_s
            self.max_s = max(self.max_s, lag)
            self.max_since_mark_s = max(self.max_since_mark_s, lag)
            if lag >= self.stall_s:
                self.stalls += 1
                self.recent.append(Stall(t, lag))
