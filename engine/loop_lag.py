"""How late an asyncio loop runs what is due: a task that sleeps a tick and measures how much it
overslept. A loop held by one callback, a full garbage collection or a CPU it shares is late for
everything it serves at once: a gateway for every session's audio, a load client for every
arrival it timestamps (a client's own stall is not the server's underrun).

The gateway reports it on /metrics and the probe in its summary; both sides import it from here
(the client side never imports the server's)."""

from __future__ import annotations

import asyncio
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
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._due = 0.0

    def start(self) -> None:
        """Watch the running loop (until ``stop``): a timer callback, not a task (a tick costs one
        timer, which matters at 200 a second on a small CPU)."""
        if self._timer is None:
            self._loop = asyncio.get_running_loop()
            self._arm(time.perf_counter())

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def mark(self) -> None:
        self.max_since_mark_s = 0.0

    def between(self, t0: float, t1: float) -> list[Stall]:
        """The kept stalls that overlapped ``t0 .. t1`` (perf_counter)."""
        return [s for s in list(self.recent) if s.t_end >= t0 and s.t_end - s.seconds <= t1]

    def _arm(self, now: float) -> None:
        assert self._loop is not None
        self._due = now + self.tick_s
        self._timer = self._loop.call_later(self.tick_s, self._tick)

    def _tick(self) -> None:
        t = time.perf_counter()
        lag = max(0.0, t - self._due)
        self.max_s = max(self.max_s, lag)
        self.max_since_mark_s = max(self.max_since_mark_s, lag)
        if lag >= self.stall_s:
            self.stalls += 1
            self.recent.append(Stall(t, lag))
        self._arm(t)
