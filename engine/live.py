"""Worker-side state of the engine's streams: one open stream (``Live``: its request, text feeder,
lead-in trim and what the trim holds back) and the opens waiting for a free stream (``OpenQueue``).
Owned by the worker thread (engine.py); nothing here locks."""

from __future__ import annotations

import asyncio
import collections
import time
from dataclasses import dataclass, field

import numpy as np

from .commands import Cancel, StreamCommand
from .level import LeadInTrimmer
from .model import Decoded, StreamParams
from .scheduler import Request
from .stream import AudioChunk, Stream
from .text_feeder import ClauseFeeder, WordFeeder
from .word_timing import WordTiming, shifted


@dataclass(frozen=True)
class OpenStream:
    """A new stream for the worker (posted by ``open_stream``; the stream posts the other commands)."""

    stream: Stream
    params: StreamParams


@dataclass
class Live:
    """Worker-side bundle of one stream."""

    stream: Stream
    loop: asyncio.AbstractEventLoop
    request: Request
    feeder: ClauseFeeder | WordFeeder
    trimmer: LeadInTrimmer
    buffered_chars: int = 0
    held_text: str = ""  # text of chunks the lead-in trimmer held back, emitted with the next audio
    held_words: list[WordTiming] = field(default_factory=list)  # their words, samples from the held audio's start
    held_samples: int = 0  # samples the lead-in trimmer holds
    compute_s: float = 0.0  # model time spent on this stream so far, as the model reports it
    frames_generated: int = 0
    stop_reason: str | None = None  # GenerateResult.stop_reason of its last frame, for the final chunk

    def chunk(self, decoded: Decoded, final: bool, text: str) -> AudioChunk | None:
        """The next chunk for the caller from a decoded one: the lead-in trim applied, with the text
        and words of what the trim held back; None while the trim holds it all (quiet lead-in)."""
        req = self.request
        pcm = np.asarray(decoded.pcm, np.float32)
        out = self.trimmer.push(pcm, final)
        text = f"{self.held_text} {text}".strip() if self.held_text else text
        # Words in samples of the held audio + this chunk; the trimmer cut what is not in ``out``.
        words = self.held_words + shifted(decoded.words, self.held_samples)
        if not (out.size or final):
            self.held_text, self.held_words = text, words
            self.held_samples += pcm.size
            return None
        cut = self.held_samples + pcm.size - out.size
        self.held_text, self.held_words, self.held_samples = "", [], 0
        chunk = AudioChunk(
            out,
            req.sample_rate_hz,
            req.samples_emitted,
            final=final,
            text=text,
            stop_reason=self.stop_reason if final else None,
            words=tuple(shifted(words, req.samples_emitted - cut)),
        )
        if out.size and req.t_first_emit is None:
            req.t_first_emit = time.perf_counter()
            self.stream.metrics.trimmed_samples = self.trimmer.trimmed_samples
        req.samples_emitted += out.size
        return chunk


@dataclass
class WaitingOpen:
    """An open waiting for a free stream, with the commands its caller posted meanwhile."""

    open: OpenStream
    deadline: float  # perf_counter after which it fails with server_busy
    commands: list[StreamCommand] = field(default_factory=list)


class OpenQueue:
    """Opens past the engine's stream limit, oldest first, each until its deadline."""

    def __init__(self) -> None:
        self._waiting: collections.OrderedDict[int, WaitingOpen] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._waiting)

    def __contains__(self, stream_id: int) -> bool:
        return stream_id in self._waiting

    def add(self, open: OpenStream, deadline: float) -> None:
        self._waiting[open.stream.id] = WaitingOpen(open, deadline)

    def hold(self, cmd: StreamCommand) -> bool:
        """Keep a waiting open's command for when it runs; a cancel removes the open (False)."""
        if isinstance(cmd, Cancel):
            self._waiting.pop(cmd.stream_id, None)
            return False
        self._waiting[cmd.stream_id].commands.append(cmd)
        return True

    def pop_oldest(self) -> WaitingOpen:
        return self._waiting.popitem(last=False)[1]

    def expired(self, now: float) -> list[WaitingOpen]:
        """The opens whose deadline has passed, removed (oldest first: deadlines are in order)."""
        out = []
        while self._waiting and next(iter(self._waiting.values())).deadline <= now:
            out.append(self.pop_oldest())
        return out

    def seconds_left(self, now: float) -> float:
        """Until the oldest open's deadline (infinity when none waits)."""
        if not self._waiting:
            return float("inf")
        return max(0.0, next(iter(self._waiting.values())).deadline - now)

    def take_all(self) -> list[WaitingOpen]:
        out = list(self._waiting.values())
        self._waiting.clear()
        return out
