"""Session output over WebRTC (a ``SessionSink``, turn.py): JSON on the ``control`` data channel,
audio resampled once to 48 kHz, cut into 20 ms frames and paced out as Opus by the track (pacer.py),
each turn's timed words sent as the pacer reaches them."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from aiortc.rtcdatachannel import RTCDataChannel

from voicewire.engine import AudioChunk

from .audio import FrameCutter, Resampler
from .pacer import FRAME_SAMPLES, SAMPLE_RATE_HZ, PacedAudioTrack, Playback
from .protocol import dumps
from .truncation import SpokenWord
from .turn import Turn

log = logging.getLogger("voicewire.webrtc")

# end_turn waits for the turn's queued audio to be paced out; a track nobody pulls (RTP never
# started) would hold the session forever, so the wait is bounded by the queue plus this slack.
DRAIN_SLACK_S = 2.0


@dataclass
class _TurnOut:
    resampler: Resampler  # engine rate -> 48 kHz, once, stateful over the turn
    cutter: FrameCutter  # exact 960-sample frames
    playback: Playback
    words: deque[SpokenWord] = field(default_factory=deque)  # timed words not sent yet, in order


class WebRtcSink:
    """Session output over WebRTC: JSON on the ``control`` channel, audio on the paced track.

    The track always carries 48 kHz Opus, whatever ``session.update`` asked for (that only shapes
    WebSocket audio). ``end_turn`` returns once the turn's last frame has left the pacer, so
    ``turn.done`` follows the audio, and ``played_ms`` is what was paced out, not what was queued.
    """

    played_source = "paced"

    def __init__(self, channel: RTCDataChannel, track: PacedAudioTrack, engine_rate_hz: int) -> None:
        self._channel = channel
        self._track = track
        self._rate = engine_rate_hz
        self._turns: dict[int, _TurnOut] = {}

    async def send_json(self, msg: dict[str, Any]) -> None:
        if self._channel.readyState == "open":
            self._channel.send(dumps(msg))

    async def start_turn(self, turn: Turn) -> None:
        playback = Playback(is_cancelled=lambda: turn.cancelled)
        out = _TurnOut(Resampler(self._rate, SAMPLE_RATE_HZ), FrameCutter(FRAME_SAMPLES), playback)
        playback.on_frame = lambda: self._pace_words(turn, out)
        self._turns[id(turn)] = out

    async def send_words(self, turn: Turn, words: list[SpokenWord]) -> None:
        # Held until the pacer sends the frame holding each word's first sample (_pace_words).
        out = self._turns.get(id(turn))
        if out is not None:
            out.words.extend(words)

    def _pace_words(self, turn: Turn, out: _TurnOut) -> None:
        """The pacer is sending a frame of this turn: the words starting up to its end go now."""
        played = out.playback.played_samples * self._rate // SAMPLE_RATE_HZ  # at the engine's rate
        due = []
        while out.words and out.words[0].start_sample < played:
            due.append(out.words.popleft().describe(self._rate))
        if due and self._channel.readyState == "open":
            self._channel.send(dumps({"type": "turn.words", "turn_id": turn.turn_id, "words": due}))

    async def send_audio(self, turn: Turn, chunk: AudioChunk) -> None:
        out = self._turns[id(turn)]
        if chunk.pcm.size:
            for frame in out.cutter.push(out.resampler.push(chunk.pcm)):
                self._track.enqueue(out.playback, frame)

    async def end_turn(self, turn: Turn, cancelled: bool) -> float:
        out = self._turns.pop(id(turn), None)
        if out is None:
            return 0.0
        pb = out.playback
        if cancelled:
            self._track.drop(pb)
            return pb.played_ms
        for frame in out.cutter.push(out.resampler.flush()):
            self._track.enqueue(pb, frame)
        tail_samples = out.cutter.buffered_samples
        for frame in out.cutter.flush():
            self._track.enqueue(pb, frame, real_samples=tail_samples)
        self._track.finish(pb)
        try:
            await asyncio.wait_for(pb.drained.wait(), pb.pending_s + DRAIN_SLACK_S)
        except TimeoutError:
            log.warning("turn %r: audio was not pulled by the track; dropping it", turn.turn_id)
            self._track.drop(pb)
        if out.words and not pb.dropped:  # words timed at the very end of the audio (none is left unsaid)
            out.playback.played_samples += FRAME_SAMPLES
            self._pace_words(turn, out)
            out.playback.played_samples -= FRAME_SAMPLES
        return pb.played_ms
