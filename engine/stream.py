"""The asyncio side of one engine stream: text in, audio chunks out.

A ``Stream`` lives on the caller's event loop. Its methods only post commands to the engine's
worker thread (never block, never run model work); audio comes back through ``loop.call_soon_threadsafe``
into an unbounded-by-design queue that the engine keeps short (it generates ahead of playback only
as far as the scheduler lets it).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .commands import Cancel, End, Flush, PushText, StreamCommand
from .word_timing import WordTiming


@dataclass(frozen=True)
class AudioChunk:
    """A piece of a stream's audio: mono float32 PCM in [-1, 1]."""

    pcm: np.ndarray  # (n,) float32
    sample_rate_hz: int
    sample_offset: int  # samples of this stream emitted before this chunk
    final: bool = False  # last chunk of the stream (pcm may be empty)
    text: str = ""  # text this chunk speaks, where the model knows it
    stop_reason: str | None = None  # final chunk: GenerateResult.stop_reason ("length": cut by a cap)
    # the words whose audio starts in this chunk, in samples from the stream's first emitted sample
    # (``sample_offset`` units; an end may lie in a later chunk), where the model knows them
    words: tuple[WordTiming, ...] = ()

    @property
    def duration_s(self) -> float:
        return self.pcm.size / self.sample_rate_hz


class StreamError(Exception):
    """The stream ended because its model work failed, or the engine refused it."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class StreamMetrics:
    """Monotonic timestamps (time.perf_counter) of one stream's life."""

    t_open: float = field(default_factory=time.perf_counter)
    t_first_text: float | None = None  # first push_text
    t_first_audio: float | None = None  # first non-empty chunk handed to the caller's loop
    t_done: float | None = None
    audio_samples: int = 0
    trimmed_samples: int = 0  # lead-in silence the engine dropped
    text_spoken: str = ""  # text of the audio emitted so far, where known

    @property
    def ttfp_s(self) -> float | None:
        if self.t_first_text is None or self.t_first_audio is None:
            return None
        return self.t_first_audio - self.t_first_text


_END = object()


class Stream:
    """Handle for one utterance. Created by ``Engine.open_stream``; iterate it for audio."""

    def __init__(
        self, stream_id: int, loop: asyncio.AbstractEventLoop, post: Callable[[StreamCommand], None]
    ):
        self.id = stream_id
        self.metrics = StreamMetrics()
        self.loop = loop  # the caller's loop: the engine hands results back on it
        self._post = post
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._ended = False  # end() called: no more text
        self._closed = False  # cancelled or finished: nothing more will be yielded
        self.cancelled = False
        self.error: StreamError | None = None
        self.stop_reason: str | None = None  # the final chunk's: "length" when a length cap cut it
        # Samples the caller has taken from the iterator. Written on the loop, read by the worker
        # (an int attribute: atomic under the GIL) to stop generating for a caller that stopped reading.
        self.consumed_samples = 0

    # --- caller side (event loop thread) ---------------------------------------------------
    def push_text(self, delta: str) -> None:
        if self._ended:
            raise StreamError("turn_ended", "text after end() for this stream")
        if self._closed or not delta:
            return
        if self.metrics.t_first_text is None:
            self.metrics.t_first_text = time.perf_counter()
        self._post(PushText(self.id, delta))

    def flush(self) -> None:
        if not self._closed and not self._ended:
            self._post(Flush(self.id))

    def end(self) -> None:
        if self._ended:
            return
        self._ended = True
        if self.metrics.t_first_text is None:
            self.metrics.t_first_text = time.perf_counter()
        if not self._closed:
            self._post(End(self.id))

    def cancel(self) -> None:
        """Barge-in: stop now. Queued audio is dropped; the engine frees the slot on its next tick."""
        if self._closed:
            return
        self.cancelled = True
        self._closed = True
        self._post(Cancel(self.id))
        self._drop_queued()
        self._queue.put_nowait(_END)

    @property
    def ended(self) -> bool:
        return self._ended

    @property
    def closed(self) -> bool:
        return self._closed

    def __aiter__(self) -> AsyncIterator[AudioChunk]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[AudioChunk]:
        while True:
            item = await self._queue.get()
            if item is _END:
                if self.error is not None:
                    raise self.error
                return
            if self.cancelled:
                continue
            self.consumed_samples += item.pcm.size
            yield item

    # --- engine side: the worker calls these on ``loop`` through call_soon_threadsafe ---------
    def deliver(self, chunk: AudioChunk) -> None:
        """The next chunk of audio (ignored once the stream is closed); a final chunk ends it."""
        if self._closed:
            return
        if chunk.pcm.size:
            if self.metrics.t_first_audio is None:
                self.metrics.t_first_audio = time.perf_counter()
            self.metrics.audio_samples += chunk.pcm.size
            if chunk.text:
                self.metrics.text_spoken = f"{self.metrics.text_spoken} {chunk.text}".strip()
        self._queue.put_nowait(chunk)
        if chunk.final:
            self.stop_reason = chunk.stop_reason
            self._finish(None)

    def fail(self, error: StreamError) -> None:
        """End the stream with ``error`` (ignored once it is closed); iteration raises it."""
        if self._closed:
            return
        self._finish(error)

    def _finish(self, error: StreamError | None) -> None:
        self.error = error
        self._closed = True
        self.metrics.t_done = time.perf_counter()
        self._queue.put_nowait(_END)

    def _drop_queued(self) -> None:
        while not self._queue.empty():
            self._queue.get_nowait()
