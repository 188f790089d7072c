"""The outbound WebRTC audio track: exact 20 ms frames that leave on the wall clock.

aiortc's sender does not pace: ``RTCRtpSender`` calls ``recv()`` and sends what it gets as fast as
``recv()`` returns. So all pacing lives here. Frame ``n`` of the current timeline leaves at
``anchor + n * 20 ms`` on the monotonic clock, which never drifts. Two events restart the timeline
(re-anchor) instead of bursting:

- a loop stall: ``recv()`` is called more than one frame late, so the backlog would go out
  back to back;
- the queue ran dry (silence between turns, or an engine underrun): the next real frame leaves
  as soon as it is queued, not at the next 20 ms slot (on average this saves 10 ms of TTFA). That
  one gap is shorter than 20 ms; it is never a burst.

The RTP clock (``pts``) is a contiguous sample counter either way, so a receiver sees jitter,
never a timestamp gap. Between turns the track sends silence, so RTP never stalls and the
receiver's jitter estimate stays steady (about 50 small packets/s per idle peer).

Frames are queued with a ``Playback``: one turn's audio on the track. It counts what actually left
(the ``played_ms`` of ``turn.done``), and tells its owner when the last frame has left.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from av import AudioFrame, Packet

from .audio import OpusEncoder

SAMPLE_RATE_HZ = 48_000  # Opus's native rate
FRAME_MS = 20  # aiortc's AUDIO_PTIME, one Opus packet
FRAME_S = FRAME_MS / 1000
FRAME_SAMPLES = SAMPLE_RATE_HZ * FRAME_MS // 1000  # 960
TIME_BASE = Fraction(1, SAMPLE_RATE_HZ)
# A recv() later than this behind its slot means the loop stalled (GC, a slow callback): restart the
# clock from now. One frame of slack keeps ordinary 1-5 ms timer jitter on the anchored timeline.
REANCHOR_LATE_S = FRAME_S

_SILENCE = np.zeros(FRAME_SAMPLES, "<i2")


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class Playback:
    """One turn's audio on a track: what was queued, what has left the server, when it is over."""

    def __init__(self, is_cancelled: Callable[[], bool] = lambda: False) -> None:
        # Polled once per frame: a barge-in flag set elsewhere (the session's Turn.cancelled) clears
        # this turn's queued frames at the next 20 ms slot even when nobody calls ``drop``.
        self.is_cancelled = is_cancelled
        self.queued_samples = 0  # real samples (padding excluded) queued so far
        self.played_samples = 0  # real samples handed to the sender (they cannot be recalled)
        # Queued, plus the frame the sender holds. That one counts as gone once the sender asks
        # for the next frame: aiortc's loop is recv -> send -> recv.
        self.pending_frames = 0
        self.finished = False  # the owner queued its last frame
        self.dropped = False  # cleared by barge-in (or the track stopped)
        self.t_first_frame_s: float | None = None  # time.monotonic() when its first frame left
        self.t_last_frame_s: float | None = None
        self.drained = asyncio.Event()  # set once its last frame has been sent (or it was dropped)
        # Called as each of its frames is handed to the sender (``played_samples`` counts it): the
        # owner sends what must not arrive before that audio (a turn's word timings).
        self.on_frame: Callable[[], None] | None = None

    @property
    def played_ms(self) -> float:
        return self.played_samples * 1000 / SAMPLE_RATE_HZ

    @property
    def pending_s(self) -> float:
        return self.pending_frames * FRAME_S

    def _check_drained(self) -> None:
        if self.pending_frames == 0 and (self.finished or self.dropped):
            self.drained.set()


@dataclass
class _Queued:
    samples: np.ndarray  # (960,) int16
    real_samples: int  # < 960 only for the zero-padded last frame of a turn
    playback: Playback


@dataclass
class PacerStats:
    frames_out: int = 0
    silent_frames_out: int = 0
    reanchors_stall: int = 0  # loop stalls absorbed by restarting the clock
    reanchors_idle: int = 0  # turns (or underruns) whose first frame left at once
    max_late_s: float = 0.0  # worst lateness of a recv() behind its slot


class PacedAudioTrack(MediaStreamTrack):
    """A live audio track of 48 kHz mono 20-ms frames, silence when nothing is queued: Opus packets
    (``encode``, what a peer connection sends), or the s16 frames themselves.

    The track encodes each frame itself, on the loop, when its slot comes (~0.1 ms), because
    aiortc's sender encodes a frame in the loop's thread pool (a thread round trip a packet, after
    a stereo resample, at 96 kb/s) and one gateway process's packets wait on those threads: with
    16 peers on 2 cores that doubles the turns whose p99 packet gap passes 30 ms
    (gateway_pacer_ab_cpu.json). A packet handed to the sender leaves as it is (mono Opus in the
    opus/48000/2 payload, as RFC 7587 allows). This can go if aiortc's sender encodes inline.
    """

    kind = "audio"

    def __init__(self, encode: bool = True) -> None:
        super().__init__()
        self._opus = OpusEncoder(SAMPLE_RATE_HZ) if encode else None
        self._queue: deque[_Queued] = deque()
        self._anchor_s: float | None = None  # monotonic time at which frame 0 of the timeline left
        self._index = 0  # frames of the current timeline already sent
        self._pts = 0  # RTP clock: contiguous, in samples
        self._idle = True  # the last frame sent was silence because nothing was queued
        self._waiter: asyncio.Future[None] | None = None  # recv() sleeping until its slot
        self._in_flight: Playback | None = None  # owner of the frame the last recv() returned
        self.stats = PacerStats()

    # --- producer side ---------------------------------------------------------------------------
    def enqueue(self, playback: Playback, frame: np.ndarray, real_samples: int = FRAME_SAMPLES) -> None:
        if frame.size != FRAME_SAMPLES:
            raise ValueError(f"frames are {FRAME_SAMPLES} samples, got {frame.size}")
        if playback.dropped or self.readyState != "live":
            return
        self._queue.append(_Queued(frame, real_samples, playback))
        playback.pending_frames += 1
        playback.queued_samples += real_samples
        if self._idle and self._waiter is not None:
            _resolve(self._waiter)  # the queue was dry: this frame need not wait for its slot

    def finish(self, playback: Playback) -> None:
        """The owner queued its last frame; ``playback.drained`` is set once it has all left."""
        playback.finished = True
        playback._check_drained()

    def drop(self, playback: Playback) -> None:
        """Barge-in: forget every queued frame of ``playback``; the next slot carries silence."""
        if playback.dropped:
            return
        playback.dropped = True
        kept = [q for q in self._queue if q.playback is not playback]
        if len(kept) != len(self._queue):
            playback.pending_frames -= len(self._queue) - len(kept)
            self._queue = deque(kept)
        playback._check_drained()

    @property
    def queued_frames(self) -> int:
        return len(self._queue)

    def stop(self) -> None:
        for pb in {id(q.playback): q.playback for q in self._queue}.values():
            self.drop(pb)
        if (sent := self._in_flight) is not None:
            self._in_flight = None
            sent.pending_frames -= 1
            sent._check_drained()
        if self._waiter is not None:
            _resolve(self._waiter)
        super().stop()

    # --- consumer side (aiortc's RTCRtpSender) -------------------------------------------------------
    async def recv(self) -> AudioFrame | Packet:
        if self.readyState != "live":
            raise MediaStreamError
        if (sent := self._in_flight) is not None:
            self._in_flight = None
            sent.pending_frames -= 1
            sent._check_drained()
        now = time.monotonic()
        if self._anchor_s is None:
            self._restart(now)
        else:
            deadline_s = self._anchor_s + self._index * FRAME_S
            late_s = now - deadline_s
            self.stats.max_late_s = max(self.stats.max_late_s, late_s)
            if late_s > REANCHOR_LATE_S:
                self.stats.reanchors_stall += 1
                self._restart(now)
            elif late_s < 0 and await self._sleep_until(deadline_s):
                self.stats.reanchors_idle += 1
                self._restart(time.monotonic())
            if self.readyState != "live":
                raise MediaStreamError
        self._index += 1
        return self._out(self._next_samples())

    def _restart(self, now_s: float) -> None:
        self._anchor_s = now_s
        self._index = 0

    async def _sleep_until(self, deadline_s: float) -> bool:
        """Sleep until the slot. True when an idle track got audio first (it then leaves at once)."""
        if self._idle and self._has_live_frame():
            return True
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        handle = loop.call_later(deadline_s - time.monotonic(), _resolve, waiter)
        self._waiter = waiter
        try:
            await waiter
        finally:
            handle.cancel()
            self._waiter = None
        return self._idle and time.monotonic() < deadline_s and self._has_live_frame()

    def _has_live_frame(self) -> bool:
        self._drop_cancelled()
        return bool(self._queue)

    def _drop_cancelled(self) -> None:
        while self._queue and (pb := self._queue[0].playback).is_cancelled():
            self.drop(pb)

    def _next_samples(self) -> np.ndarray:
        self._drop_cancelled()
        if not self._queue:
            self._idle = True
            self.stats.silent_frames_out += 1
            self.stats.frames_out += 1
            return _SILENCE
        item = self._queue.popleft()
        pb = item.playback
        now = time.monotonic()
        if pb.t_first_frame_s is None:
            pb.t_first_frame_s = now
        pb.t_last_frame_s = now
        pb.played_samples += item.real_samples
        if pb.on_frame is not None:
            pb.on_frame()
        self._in_flight = pb
        self._idle = False
        self.stats.frames_out += 1
        return item.samples

    def _out(self, samples: np.ndarray) -> AudioFrame | Packet:
        out: AudioFrame | Packet
        if self._opus is None:
            out = AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
            out.sample_rate = SAMPLE_RATE_HZ
        else:
            (out,) = (Packet(p) for p in self._opus.encode(samples))  # libopus: one packet a frame
        out.pts = self._pts
        out.time_base = TIME_BASE
        self._pts += FRAME_SAMPLES
        return out
