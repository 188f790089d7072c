"""What a listener hears of a turn, from when its audio reached the client.

The listener is ``voicewire.engine.Playout``, the one underrun rule: playback starts at the first
byte (plus a buffer) and runs in real time, and audio that comes late stalls it. Over it:

- ``ttfb``: the first audio byte arrived;
- ``ttfa``: the first audible sample played (the first 10 ms window above the engine's onset
  level, ``ONSET_THRESHOLD_DBFS``), for a listener who starts playing at the first byte;
- ``e2e``: that listener has played the turn's last sample;
- ``underruns`` / ``stall``: stalls of a listener who starts ``buffer_s`` after the first byte.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from voicewire.engine import ONSET_THRESHOLD_DBFS, Playout, first_audible_sample

from .messages import ReceivedAudio


@dataclass(frozen=True)
class Arrival:
    """A piece of a turn's audio as it reached the client."""

    t_s: float  # perf_counter on arrival
    samples: int
    onset_sample: int | None = None  # the turn's first audible window, if it starts in this piece


@dataclass(frozen=True)
class PlayedTurn:
    starts_s: list[float]  # when each piece starts playing
    end_s: float  # when the last sample has played
    underruns: int
    stall_s: float
    max_stall_s: float
    max_stall_end_s: float | None


@dataclass(frozen=True)
class Heard:
    """A turn as its listener heard it; times in seconds from the turn's first text sent."""

    ttfb_s: float
    ttfa_s: float | None  # None: nothing audible
    e2e_s: float
    underruns: int
    stall_s: float
    max_stall_s: float
    max_stall_end_s: float | None  # perf_counter
    audio_s: float


def playout(arrivals: Sequence[Arrival], sample_rate_hz: int, buffer_s: float) -> PlayedTurn:
    """``arrivals`` played by a listener who starts ``buffer_s`` after the first one."""
    listener = Playout(buffer_s=buffer_s)
    starts = [listener.arrive(a.t_s, a.samples / sample_rate_hz) for a in arrivals]
    assert listener.end_s is not None, "no audio to play"
    return PlayedTurn(
        starts, listener.end_s, listener.underruns, listener.stall_s, listener.max_stall_s, listener.max_stall_end_s
    )


def audible_time_s(arrivals: Sequence[Arrival], sample_rate_hz: int) -> float | None:
    """When a listener who starts at the first byte plays the first audible sample."""
    p = playout(arrivals, sample_rate_hz, 0.0)
    for a, start in zip(arrivals, p.starts_s, strict=True):
        if a.onset_sample is not None:
            return start + a.onset_sample / sample_rate_hz
    return None


def ws_arrivals(chunks: Sequence[ReceivedAudio], threshold_dbfs: float = ONSET_THRESHOLD_DBFS) -> list[Arrival]:
    """PCM messages as arrivals; the onset is found over the whole turn (a 10 ms window may
    straddle two messages) and marked on the message that holds it."""
    if not chunks:
        return []
    rate = chunks[0].sample_rate_hz
    pcm = np.concatenate([c.pcm() for c in chunks]).astype(np.float32) / 32768.0
    onset = first_audible_sample(pcm, rate, threshold_dbfs)
    out: list[Arrival] = []
    start = 0
    for c in chunks:
        n = len(c.data) // 2
        mark = onset - start if onset is not None and start <= onset < start + n else None
        out.append(Arrival(c.t_received_s, n, mark))
        start += n
    return out


def hear(arrivals: Sequence[Arrival], sample_rate_hz: int, t_first_text_s: float, buffer_s: float) -> Heard | None:
    """The turn's figures (see the module docstring); None if no audio arrived."""
    if not arrivals:
        return None
    audible = audible_time_s(arrivals, sample_rate_hz)
    buffered = playout(arrivals, sample_rate_hz, buffer_s)
    return Heard(
        ttfb_s=arrivals[0].t_s - t_first_text_s,
        ttfa_s=None if audible is None else audible - t_first_text_s,
        e2e_s=playout(arrivals, sample_rate_hz, 0.0).end_s - t_first_text_s,
        underruns=buffered.underruns,
        stall_s=buffered.stall_s,
        max_stall_s=buffered.max_stall_s,
        max_stall_end_s=buffered.max_stall_end_s,
        audio_s=sum(a.samples for a in arrivals) / sample_rate_hz,
    )
