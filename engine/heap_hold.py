"""One engine's part in the process's heap handling (heap.py): the freeze it holds while it runs,
and the collections the process has had since it started, copied into its stats."""

from __future__ import annotations

from . import heap
from .stats import EngineStats


class HeapHold:
    def __init__(self) -> None:
        self._frozen = False
        self._base = (0, 0.0)  # the process's collections and their seconds before this engine started

    def start(self, freeze: bool) -> None:
        heap.PAUSES.install()
        if freeze and not self._frozen:
            heap.freeze()
            self._frozen = True
        self._base = (sum(heap.PAUSES.count), sum(heap.PAUSES.seconds))
        heap.PAUSES.mark()  # the pauses a listener can meet count from here, after the freeze's collect

    def release(self) -> None:
        if self._frozen:
            heap.release()
            self._frozen = False

    def record(self, stats: EngineStats) -> None:
        pauses = heap.PAUSES
        stats.gc_collections = sum(pauses.count) - self._base[0]
        stats.gc_pause_s = sum(pauses.seconds) - self._base[1]
        stats.gc_pause_max_s = pauses.max_s
        stats.gc_pause_max_since_ready_s = pauses.max_since_mark_s
