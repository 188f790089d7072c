"""One engine's part in the process's heap handling (heap.py): the freeze it holds while it runs, its
streams in flight as the process's quiet moments see them, and the collections the process has had
since it started, copied into its stats."""

from __future__ import annotations

from . import heap
from .stats import EngineStats


class HeapHold:
    def __init__(self) -> None:
        self._frozen = False
        self._quiet_held = False
        self._busy = False
        self._base = (0, 0.0)  # the process's collections and their seconds before this engine started

    def start(self, freeze: bool, busy_max_s: float | None) -> None:
        heap.PAUSES.install()
        if freeze and not self._frozen:
            heap.freeze()
            self._frozen = True
            # a quiet collection walks what is alive then: with the start-up heap frozen, a few ms
            if busy_max_s:
                heap.QUIET.hold(busy_max_s)
                self._quiet_held = True
        self._base = (sum(heap.PAUSES.count), sum(heap.PAUSES.seconds))
        heap.PAUSES.mark()  # the pauses a listener can meet count from here, after the freeze's collect

    def release(self) -> None:
        self.streams(0)
        if self._quiet_held:
            heap.QUIET.release()
            self._quiet_held = False
        if self._frozen:
            heap.release()
            self._frozen = False

    def streams(self, in_flight: int) -> None:
        """The engine's streams in flight now (its worker, every pass): the process's quiet moments."""
        if not self._quiet_held:
            return
        if (in_flight > 0) != self._busy:
            self._busy = in_flight > 0
            if self._busy:
                heap.QUIET.busy()
            else:
                heap.QUIET.quiet()
        elif self._busy:
            heap.QUIET.check()

    def record(self, stats: EngineStats) -> None:
        pauses = heap.PAUSES
        stats.gc_collections = sum(pauses.count) - self._base[0]
        stats.gc_pause_s = sum(pauses.seconds) - self._base[1]
        stats.gc_pause_max_s = pauses.max_s
        stats.gc_pause_max_since_ready_s = pauses.max_since_mark_s
