"""The codec work the engine's worker has begun and not yet handed out (engine.py's pipeline).

Pieces are kept in the order they were begun. A piece that is done is handed out as soon as no
earlier piece still out holds one of its streams: a stream's chunks stay in order, and an urgent
piece (on the model's urgent lane, Model.urgent_decode) leaves long before the bulk piece begun
before it. The worker waits for the oldest piece only when told to, or while more than
``max_bulk`` bulk pieces are out; while it waits for a bulk piece it keeps handing out the urgent
pieces behind it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import NamedTuple

from .model import Decoded, DecodeWork, Queued

# while waiting, finished work is looked for this often: a device event has no wait-for-either,
# and a query costs microseconds
POLL_S = 0.0002


class Piece(NamedTuple):
    """A piece of codec work begun: its chunks, their audio once done, the lane it runs on."""

    due: list[DecodeWork]
    finish: Queued[list[Decoded]]
    urgent: bool


class CodecWork:
    def __init__(self, max_bulk: int, hand_out: Callable[[Piece], None]) -> None:
        self._max_bulk = max_bulk
        self._hand_out = hand_out  # takes a piece's audio (calling its ``finish``) to its streams
        self._pieces: list[Piece] = []
        self.polled_s = 0.0  # the worker's sleeps between looks at the device (a wait for it, too)

    def __bool__(self) -> bool:
        return bool(self._pieces)

    def add(self, piece: Piece) -> None:
        self._pieces.append(piece)

    def urgent_out(self) -> bool:
        return any(p.urgent for p in self._pieces)

    def take(self, wait: bool) -> int:
        """Hands out the audio of begun codec work as far as it is done; with ``wait``, or while more
        than ``max_bulk`` bulk pieces are begun, waits for the oldest, handing out an urgent piece
        behind it as soon as that is done. Returns how many pieces it took."""
        taken = 0
        while True:
            taken += self._take_done()
            if not self._pieces:
                return taken
            if not (wait or sum(not p.urgent for p in self._pieces) > self._max_bulk):
                return taken
            if not self._pieces[0].urgent and self.urgent_out():
                self.poll()
                continue
            self._hand_out(self._pieces.pop(0))
            taken += 1

    def take_urgent(self) -> int:
        """Waits for the urgent pieces begun, handing each out as soon as it is done (and the rest
        that is done meanwhile). Returns how many pieces it took."""
        taken = 0
        while True:
            taken += self._take_done()
            first = next((i for i, p in enumerate(self._pieces) if p.urgent), None)
            if first is None:
                return taken
            before = {d.stream_id for p in self._pieces[:first] for d in p.due}
            if before.isdisjoint(d.stream_id for d in self._pieces[first].due):
                self._hand_out(self._pieces.pop(first))  # waits for it
                taken += 1
            else:  # a stream of it has earlier audio out: that goes first
                self.poll()

    def poll(self) -> None:
        t0 = time.perf_counter()
        time.sleep(POLL_S)
        self.polled_s += time.perf_counter() - t0

    def settle(self) -> None:
        """Waits for every piece, its audio dropped (shutdown: the device idle when the worker ends)."""
        while self._pieces:
            with contextlib.suppress(Exception):  # at shutdown a failed piece has no stream to tell
                self._pieces.pop(0).finish()

    def _take_done(self) -> int:
        """Hands out every piece already done whose streams have no earlier piece out."""
        taken = 0
        waiting: set[int] = set()  # streams of the pieces still out before the one looked at
        i = 0
        while i < len(self._pieces):
            piece = self._pieces[i]
            streams = {d.stream_id for d in piece.due}
            if waiting.isdisjoint(streams) and piece.finish.done():
                self._hand_out(self._pieces.pop(i))
                taken += 1
            else:
                waiting |= streams
                i += 1
        return taken
