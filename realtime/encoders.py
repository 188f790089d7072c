"""Speech encoders of ``POST /v1/audio/speech``: engine PCM chunks in, the bytes of one response
format out, as each chunk arrives (the first bytes go with the first audio).

    pcm, wav     int16 at the engine's rate (wav: a header of unknown length first)
    mulaw, alaw  G.711 at 8000 Hz, headerless (telephony: Twilio media streams, SIP trunks)
    mp3, opus, aac, flac   PyAV encoders muxed into a streaming container (MP3 frames, Ogg, ADTS, FLAC)

A container encoder writes into ``_Chunks``, which has no ``seek``: PyAV then treats the output as
a pipe, so no muxer goes back to patch a header, and what is written can leave at once.
"""

from __future__ import annotations

import struct
from fractions import Fraction
from typing import Protocol

import av
import numpy as np
from av.audio.stream import AudioStream

from .audio import Resampler, pcm16_bytes, to_int16
from .protocol import G711_FORMATS, G711_RATE_HZ
from .telephony import G711Codec

MP3_BITRATE_BPS = 128_000  # libmp3lame at 24 kHz (MPEG-2 layer III) tops out at 160 kb/s
AAC_BITRATE_BPS = 64_000
OPUS_BITRATE_BPS = 32_000  # speech: the WebSocket's and WebRTC's Opus setting (audio.py)
# The Ogg muxer holds a page up to a second by default: one page per 20 ms packet keeps the first
# bytes with the first audio, for ~28 bytes of page header a packet (42 kb/s on the wire, not 32).
OGG_PAGE_DURATION_US = 20_000
# A compressing encoder's work grows with its input (libmp3lame: ~7 ms a second of audio on this
# 2-core machine, and the engine's first chunk can hold seconds), so it takes a chunk this much at
# a time: the first slice's bytes leave before the rest is encoded, and the event loop serves
# other sessions between slices.
ENCODE_SLICE_MS = 40

# A WAV header's RIFF and data sizes for a stream of unknown length: the maximum, as ffmpeg writes
# to a pipe. Python's wave, soundfile and PyAV all read every sample of such a file; only
# ``wave.getnframes`` reports the maximum (89,478 s at 24 kHz). Sizes 0 make wave refuse the file
# and soundfile read no samples, so the maximum is the one that every reader reads.
UNKNOWN_WAV_SIZE = 0xFFFFFFFF


def streaming_wav_header(sample_rate_hz: int) -> bytes:
    """A 44-byte PCM16 mono WAV header for a stream of unknown length."""
    return (
        b"RIFF"
        + struct.pack("<I", UNKNOWN_WAV_SIZE)
        + b"WAVE"
        + b"fmt "
        + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate_hz, sample_rate_hz * 2, 2, 16)
        + b"data"
        + struct.pack("<I", UNKNOWN_WAV_SIZE)
    )


class SpeechEncoder(Protocol):
    slice_samples: int  # the most samples one push should get; 0: a whole chunk (cheap to encode)

    def push(self, pcm: np.ndarray) -> bytes:
        """Float mono PCM at the engine's rate -> the bytes ready to send (maybe none yet)."""
        ...

    def flush(self) -> bytes:
        """The rest: the encoder's and resampler's tails, the container's trailer."""
        ...


class PcmEncoder:
    """int16 little-endian at the engine's rate; ``wav`` puts a streaming WAV header first."""

    slice_samples = 0

    def __init__(self, sample_rate_hz: int, wav: bool) -> None:
        self._head = streaming_wav_header(sample_rate_hz) if wav else b""

    def push(self, pcm: np.ndarray) -> bytes:
        head, self._head = self._head, b""
        return head + pcm16_bytes(pcm)

    def flush(self) -> bytes:
        return self._head


class G711Encoder:
    """Resampled once to 8000 Hz (libswresample's low-pass), then G.711 bytes, one per sample."""

    slice_samples = 0

    def __init__(self, law: str, in_rate_hz: int) -> None:
        self._resampler = Resampler(in_rate_hz, G711_RATE_HZ)
        self._codec = G711Codec(law)

    def push(self, pcm: np.ndarray) -> bytes:
        return self._codec.encode(self._resampler.push(pcm))

    def flush(self) -> bytes:
        return self._codec.encode(self._resampler.flush())


class _Chunks:
    """A write-only file for PyAV's muxer: collects what it writes until ``take``."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def write(self, data: bytes) -> int:
        self._buf += data
        return len(data)

    def take(self) -> bytes:
        out = bytes(self._buf)
        self._buf.clear()
        return out


# response_format -> (container, codec, bit rate or 0 for lossless, muxer options)
_CONTAINERS: dict[str, tuple[str, str, int, dict[str, str]]] = {
    "mp3": ("mp3", "libmp3lame", MP3_BITRATE_BPS, {}),
    "opus": ("ogg", "libopus", OPUS_BITRATE_BPS, {"page_duration": str(OGG_PAGE_DURATION_US)}),
    "aac": ("adts", "aac", AAC_BITRATE_BPS, {}),
    "flac": ("flac", "flac", 0, {}),
}


class ContainerEncoder:
    """One PyAV output container and audio stream; the codec gets int16 frames as they come (PyAV
    converts the sample format and cuts the codec's frame size)."""

    def __init__(self, fmt: str, sample_rate_hz: int) -> None:
        container, codec, bit_rate, options = _CONTAINERS[fmt]
        self._rate = sample_rate_hz
        self.slice_samples = sample_rate_hz * ENCODE_SLICE_MS // 1000
        self._out = _Chunks()
        self._container = av.open(self._out, "w", format=container, options=options)
        stream = self._container.add_stream(codec, rate=sample_rate_hz)
        assert isinstance(stream, AudioStream)
        self._stream = stream
        self._stream.layout = "mono"
        if bit_rate:
            self._stream.bit_rate = bit_rate
        self._pts = 0

    def push(self, pcm: np.ndarray) -> bytes:
        if pcm.size:
            frame = av.AudioFrame.from_ndarray(to_int16(pcm).reshape(1, -1), format="s16", layout="mono")
            frame.sample_rate = self._rate
            frame.pts = self._pts
            frame.time_base = Fraction(1, self._rate)
            self._pts += pcm.size
            self._container.mux(self._stream.encode(frame))
        return self._out.take()

    def flush(self) -> bytes:
        self._container.mux(self._stream.encode(None))
        self._container.close()
        return self._out.take()


def speech_encoder(fmt: str, sample_rate_hz: int) -> SpeechEncoder:
    """The encoder of response format ``fmt`` (a canonical name: http_api.FORMATS)."""
    if fmt in ("pcm", "wav"):
        return PcmEncoder(sample_rate_hz, wav=fmt == "wav")
    if fmt in G711_FORMATS:
        return G711Encoder(fmt, sample_rate_hz)
    return ContainerEncoder(fmt, sample_rate_hz)
