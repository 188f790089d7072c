"""Log lines at a bounded rate: a client that sends thousands of bad messages must not write
thousands of log lines (each refusal and client error is still counted in the metrics).

Per key (an error code), at most ``burst`` lines per ``window_s``; the first line after a quiet
spell says how many were left out.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

WINDOW_S = 10.0
BURST_LINES = 20  # per key and window: enough to see a pattern, not enough to fill a disk


class LogLimiter:
    def __init__(
        self,
        window_s: float = WINDOW_S,
        burst: int = BURST_LINES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._window_s = window_s
        self._burst = burst
        self._clock = clock
        self._windows: dict[str, tuple[float, int, int]] = {}  # key -> (window start, logged, dropped)

    def log(
        self, logger: logging.Logger, msg: str, *args: Any, key: str, level: int = logging.INFO, **kwargs: Any
    ) -> bool:
        """Log unless ``key`` is over its rate; returns whether the line was written."""
        now = self._clock()
        start, logged, dropped = self._windows.get(key, (now, 0, 0))
        if now - start >= self._window_s:
            if dropped:
                logger.log(level, "%d more %r lines were left out in %.0f s", dropped, key, now - start)
            start, logged, dropped = now, 0, 0
        if logged >= self._burst:
            self._windows[key] = (start, logged, dropped + 1)
            return False
        self._windows[key] = (start, logged + 1, dropped)
        if len(self._windows) > 1024:  # keys are error codes: a few dozen; never grow without bound
            self._windows = {k: v for k, v in self._windows.items() if now - v[0] < self._window_s}
        logger.log(level, msg, *args, **kwargs)
        return True
