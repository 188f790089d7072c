"""The garbage collector's pauses: what they cost a server, and keeping them short.

A collection of the oldest generation walks every tracked object in the process while it holds the
GIL. With torch and a model loaded that is ~170,000 objects and 100-125 ms (on the H200's host and
on a CI core alike). For that long no frame step is begun, no chunk is handed out and no packet
leaves. Under load one comes every several seconds, as each stream's objects outlive the young
generations, and the streams between their first chunk (80 ms of audio) and their second run dry.

``freeze()`` moves what exists once a server is warm (modules, the model, its graphs) into the
collector's permanent generation, so later collections walk only what serving made: a few ms. Only
the first holder freezes: what a later one would add (another engine's model, a test's) may become
garbage while the first still holds, and frozen garbage is never freed. ``release()`` by the last
holder hands it all back, so a process that drops its engines (a benchmark running variants, a
test) can collect their cycles again.

``QUIET`` moves the oldest generation's collections to the moments no stream is in flight (its class
says why). ``PAUSES`` times every collection in the process once installed (an engine installs it at
start).
"""

from __future__ import annotations

import gc
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

GENERATIONS = 3
HELD_THRESHOLD = 1 << 30  # middle-generation collections before the collector starts a full one: never
KEPT_PAUSE_S = 0.001  # pauses kept in ``Pauses.recent``: young collections are thousands a second under load


@dataclass(frozen=True)
class Pause:
    generation: int
    t_end: float  # perf_counter
    seconds: float


class Pauses:
    """Every collection's pause in this process, from ``gc.callbacks``. The callbacks run in the
    thread that triggered the collection, with the GIL held; collections never nest."""

    def __init__(self, keep: int = 4096) -> None:
        self.count = [0] * GENERATIONS
        self.seconds = [0.0] * GENERATIONS
        self.max_s = 0.0
        # the longest since ``mark()`` (an engine turning ready): start-up's own collections, the
        # freeze's included, are not what a listener waits on
        self.max_since_mark_s = 0.0
        self.recent: deque[Pause] = deque(maxlen=keep)  # the latest of KEPT_PAUSE_S or more
        self._t_start: float | None = None
        self._installed = False

    def install(self) -> None:
        if not self._installed:
            gc.callbacks.append(self._callback)
            self._installed = True

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t_start = time.perf_counter()
            return
        if self._t_start is None:
            return
        t = time.perf_counter()
        g, s = info["generation"], t - self._t_start
        self._t_start = None
        self.count[g] += 1
        self.seconds[g] += s
        self.max_s = max(self.max_s, s)
        self.max_since_mark_s = max(self.max_since_mark_s, s)
        if s >= KEPT_PAUSE_S:
            self.recent.append(Pause(g, t, s))

    def mark(self) -> None:
        self.max_since_mark_s = 0.0

    def between(self, t0: float, t1: float) -> list[Pause]:
        """The kept pauses that overlapped ``t0 .. t1`` (perf_counter)."""
        # a copy first: a collection while this runs (any allocation may start one) appends to the deque
        return [p for p in list(self.recent) if p.t_end >= t0 and p.t_end - p.seconds <= t1]


PAUSES = Pauses()
_lock = threading.Lock()
_holders = 0


def freeze() -> None:
    """A holder of the frozen heap: the first one collects what is garbage already and freezes
    everything alive. Each call needs a ``release()``."""
    global _holders
    with _lock:
        _holders += 1
        if _holders == 1:
            gc.collect()
            gc.freeze()


def release() -> None:
    """One holder done; the last one hands the frozen objects back to the collector."""
    global _holders
    with _lock:
        _holders -= 1
        if _holders == 0:
            gc.unfreeze()


class QuietCollections:
    """The oldest generation left alone while a stream is in flight in any of the process's engines,
    and collected when the last one ends.

    A stream's objects (~45 tracked ones in a core: the engine's, its forwarder's task) live as long
    as it generates, a second or more under load, long enough to reach the oldest generation, and the
    collector starts a full collection each time those promoted pass a quarter of what the last one
    kept: under steady load every few seconds, each walking everything alive outside the frozen heap
    with the interpreter's lock held, every stream's next step behind it (7-28 ms in a GPU host's core
    at 400 turns/s). A finished stream leaves no cyclic garbage (what refcounts do not free), so
    those walks find little to free; once no stream is in flight the same collection walks only what
    is alive then. Quiet, the process has the collector's own rule; busy without a break for
    ``busy_max_s``, too, until its next quiet moment, so whatever cyclic garbage it does make is
    bounded.

    Engines say ``busy()`` / ``quiet()`` on their transitions and ``check()`` as they step; each of
    ``hold()`` needs a ``release()``. Any thread may call; the collection runs on ``quiet()``'s."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holders = 0
        self._busy = 0
        self._busy_max_s = 0.0
        self._busy_since = 0.0
        self._own: tuple[int, int, int] | None = None  # the collector's thresholds, while held
        self.collections = 0  # full ones as the last stream ended
        self.overruns = 0  # busy past busy_max_s: the collector's own rule back until quiet

    def hold(self, busy_max_s: float) -> None:
        with self._lock:
            self._holders += 1
            self._busy_max_s = busy_max_s if self._holders == 1 else min(self._busy_max_s, busy_max_s)
            if self._holders == 1:
                self._own = gc.get_threshold()

    def release(self) -> None:
        with self._lock:
            self._holders -= 1
            if self._holders == 0:
                self._restore()
                self._own, self._busy = None, 0

    def busy(self) -> None:
        with self._lock:
            self._busy += 1
            if self._busy == 1 and self._own is not None:
                self._busy_since = time.perf_counter()
                gc.set_threshold(self._own[0], self._own[1], HELD_THRESHOLD)

    def quiet(self) -> None:
        with self._lock:
            self._busy -= 1
            if self._busy or self._own is None:
                return
            self._restore()
            # as many young collections as the collector's own rule waits for: what the busy
            # stretch promoted is collected now, while nothing is in flight
            if gc.get_count()[2] >= self._own[2]:
                gc.collect()
                self.collections += 1

    def check(self) -> None:
        if self._busy and time.perf_counter() - self._busy_since > self._busy_max_s:
            with self._lock:
                if self._busy and self._own is not None and gc.get_threshold() != self._own:
                    self._restore()
                    self.overruns += 1

    def _restore(self) -> None:
        if self._own is not None:
            gc.set_threshold(*self._own)


QUIET = QuietCollections()
