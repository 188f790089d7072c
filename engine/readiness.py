"""Which streams a frame step would make progress for now: the worker's ready set, kept up to date.

A stream is ready when its generation is not done, its caller has not fallen more than
``max_ahead_samples`` behind its audio, and the model says its slot is ready (``Model.ready``).
Asking every live stream before every step costs the worker a few µs a stream (hundreds of streams,
most of them unchanged since the last step), so only the streams something happened to are asked
again: the worker marks a stream when it opens, takes text, is stepped (begun or recorded) or
emits audio, the only events that change what a slot's readiness depends on (a model's slot state
changes only through the worker's calls). A stream held back only because its caller is too far
behind is asked again every time: the caller's loop takes its audio at any moment.
Owned by the worker thread.
"""

from __future__ import annotations

from collections.abc import Iterable

from .live import Live
from .model import Model


class Readiness:
    def __init__(self) -> None:
        self._ready: set[int] = set()
        self._dirty: set[int] = set()  # streams to ask again
        self._held: set[int] = set()  # streams too far ahead of their callers

    def mark(self, stream_ids: Iterable[int]) -> None:
        """These streams' readiness may have changed."""
        self._dirty.update(stream_ids)

    def drop(self, stream_id: int) -> None:
        """The stream is gone."""
        self._ready.discard(stream_id)
        self._dirty.discard(stream_id)
        self._held.discard(stream_id)

    def current(self, live: dict[int, Live], model: Model, max_ahead_samples: int) -> set[int]:
        """The ready streams (the set itself: valid until the next ``mark`` or ``drop``)."""
        if not (self._dirty or self._held):
            return self._ready
        ask = self._dirty | self._held if self._held else self._dirty
        self._dirty = set()
        ready, held = self._ready, self._held
        for sid in ask:
            lv = live.get(sid)
            if lv is None or lv.request.generation_done:
                ready.discard(sid)
                held.discard(sid)
            elif lv.request.samples_emitted - lv.stream.consumed_samples >= max_ahead_samples:
                ready.discard(sid)
                held.add(sid)
            else:
                held.discard(sid)
                if model.ready(lv.request.slot):
                    ready.add(sid)
                else:
                    ready.discard(sid)
        return ready
