"""Audio on the way out: float PCM -> PCM16 bytes, resampling, exact frames, Opus packets (PyAV),
G.711 frames (telephony.py)."""

from __future__ import annotations

from fractions import Fraction

import av
import numpy as np

from .protocol import G711_FORMATS, G711_RATE_HZ
from .telephony import G711_FRAME_SAMPLES, G711Codec

OPUS_FRAME_MS = 20
OPUS_BITRATE_BPS = (
    32_000  # speech: ~28 kb/s real at this setting; aiortc's fixed 96 kb/s is far more than needed
)


def to_int16(pcm: np.ndarray) -> np.ndarray:
    return (np.clip(pcm, -1.0, 1.0) * 32767.0).astype("<i2")


def pcm16_bytes(pcm: np.ndarray) -> bytes:
    return to_int16(pcm).tobytes()


class Resampler:
    """Streaming resampler (libswresample through PyAV), float mono in, int16 mono out.

    Stateful: feed the chunks of one stream in order, then ``flush`` for the filter's tail.
    """

    def __init__(self, in_rate_hz: int, out_rate_hz: int) -> None:
        self.in_rate_hz = in_rate_hz
        self.out_rate_hz = out_rate_hz
        self._pts = 0
        self._rs = (
            av.AudioResampler(format="s16", layout="mono", rate=out_rate_hz)
            if in_rate_hz != out_rate_hz
            else None
        )

    def push(self, pcm: np.ndarray) -> np.ndarray:
        pcm16 = to_int16(pcm)
        if self._rs is None or pcm16.size == 0:
            return pcm16
        frame = av.AudioFrame.from_ndarray(pcm16.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = self.in_rate_hz
        frame.pts = self._pts
        frame.time_base = Fraction(1, self.in_rate_hz)
        self._pts += pcm16.size
        return self._collect(self._rs.resample(frame))

    def flush(self) -> np.ndarray:
        if self._rs is None:
            return np.zeros(0, "<i2")
        return self._collect(self._rs.resample(None))

    @staticmethod
    def _collect(frames: list[av.AudioFrame]) -> np.ndarray:
        if not frames:
            return np.zeros(0, "<i2")
        return np.concatenate([f.to_ndarray().reshape(-1) for f in frames]).astype("<i2", copy=False)


class FrameCutter:
    """Cuts an int16 sample stream into exact frames of ``frame_samples``; ``flush`` pads the last one."""

    def __init__(self, frame_samples: int) -> None:
        self.frame_samples = frame_samples
        self._rest = np.zeros(0, "<i2")

    @property
    def buffered_samples(self) -> int:
        return self._rest.size

    def push(self, samples: np.ndarray) -> list[np.ndarray]:
        data = np.concatenate([self._rest, samples]) if self._rest.size else samples
        n = data.size // self.frame_samples
        frames = [data[i * self.frame_samples : (i + 1) * self.frame_samples] for i in range(n)]
        self._rest = data[n * self.frame_samples :]
        return frames

    def flush(self) -> list[np.ndarray]:
        if self._rest.size == 0:
            return []
        last = np.zeros(self.frame_samples, "<i2")
        last[: self._rest.size] = self._rest
        self._rest = np.zeros(0, "<i2")
        return [last]

    def clear(self) -> None:
        self._rest = np.zeros(0, "<i2")


class OpusEncoder:
    """libopus through PyAV: exact 20 ms int16 mono frames in, one Opus packet per frame out."""

    def __init__(self, sample_rate_hz: int = 48_000, bitrate_bps: int = OPUS_BITRATE_BPS) -> None:
        self.sample_rate_hz = sample_rate_hz
        self.frame_samples = sample_rate_hz * OPUS_FRAME_MS // 1000
        ctx = av.CodecContext.create("libopus", "w")
        ctx.sample_rate = sample_rate_hz
        ctx.layout = "mono"
        ctx.format = "s16"
        ctx.bit_rate = bitrate_bps
        ctx.time_base = Fraction(1, sample_rate_hz)
        ctx.open()
        self._ctx = ctx
        self._pts = 0

    def encode(self, frame_samples: np.ndarray) -> list[bytes]:
        if frame_samples.size != self.frame_samples:
            raise ValueError(f"Opus frames must be {self.frame_samples} samples, got {frame_samples.size}")
        frame = av.AudioFrame.from_ndarray(frame_samples.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = self.sample_rate_hz
        frame.pts = self._pts
        frame.time_base = Fraction(1, self.sample_rate_hz)
        self._pts += frame_samples.size
        return [bytes(p) for p in self._ctx.encode(frame)]  # type: ignore[attr-defined]


class TurnAudioEncoder:
    """Per-turn output encoder of the WebSocket transport: engine PCM -> binary messages.

    pcm16: raw little-endian int16 at the session's rate. opus: one Opus packet (20 ms) per message.
    mulaw / alaw: 20 ms of G.711 at 8000 Hz (160 bytes) per message, whatever ``out_rate_hz`` says.
    """

    def __init__(self, fmt: str, in_rate_hz: int, out_rate_hz: int) -> None:
        self.fmt = fmt
        self._g711 = G711Codec(fmt) if fmt in G711_FORMATS else None
        self._resampler = Resampler(in_rate_hz, G711_RATE_HZ if self._g711 else out_rate_hz)
        self._opus = OpusEncoder(out_rate_hz) if fmt == "opus" else None
        frame_samples = self._opus.frame_samples if self._opus else G711_FRAME_SAMPLES if self._g711 else 0
        self._cutter = FrameCutter(frame_samples) if frame_samples else None

    def push(self, pcm: np.ndarray) -> list[bytes]:
        return self._pack(self._resampler.push(pcm), final=False)

    def flush(self) -> list[bytes]:
        return self._pack(self._resampler.flush(), final=True)

    def _pack(self, samples: np.ndarray, final: bool) -> list[bytes]:
        if self._cutter is None:
            return [samples.tobytes()] if samples.size else []
        frames = self._cutter.push(samples)
        if final:
            frames += self._cutter.flush()
        if self._g711 is not None:
            return [self._g711.encode(f) for f in frames]
        assert self._opus is not None
        return [pkt for f in frames for pkt in self._opus.encode(f)]
