"""Reference clips for the voices tests: a usable one, and the hostile files an attacker uploaded,
each made with PyAV the way any client could make it."""

from __future__ import annotations

import io
import wave
from collections.abc import Iterable
from typing import Any

import aiohttp
import av
import numpy as np

RATE_HZ = 24_000
# A Qwen3-TTS Base model that clones, with random weights: small enough for the CPU tests.
TINY_BASE = {"size": "tiny-base", "seed": 3, "max_slots": 4, "max_batch_size": 4, "max_seq_len": 256}


def clip(seconds: float, rate_hz: int = RATE_HZ, seed: int = 0, level: float = 0.3) -> np.ndarray:
    """A voiced chirp with a loudness contour (no speech is available here): it reaches every band."""
    t = np.arange(round(seconds * rate_hz)) / rate_hz
    f0 = 120.0 + 60.0 * t / max(seconds, 1e-3) + 8.0 * np.sin(2 * np.pi * 5.0 * t)
    phase = 2 * np.pi * np.cumsum(f0) / rate_hz
    voiced = sum(np.sin(k * phase) / k for k in range(1, 8))
    noise = np.random.default_rng(seed).standard_normal(t.size)
    return (level * (0.6 + 0.4 * np.sin(2 * np.pi * 1.3 * t) ** 2) * voiced + 0.03 * level * noise).astype(
        np.float32
    )


def wav_bytes(pcm: np.ndarray, rate_hz: int = RATE_HZ) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate_hz)
        w.writeframes((np.clip(pcm, -1, 1) * 32767).astype("<i2").tobytes())
    return out.getvalue()


def voice_form(name: str, audio: bytes, transcript: str | None = None) -> aiohttp.FormData:
    form = aiohttp.FormData()
    form.add_field("name", name)
    form.add_field("audio", audio, filename="reference.wav", content_type="audio/wav")
    if transcript is not None:
        form.add_field("transcript", transcript)
    return form


def encoded(
    pcm: np.ndarray, rate_hz: int, codec: str = "pcm_s16le", container: str = "wav", layout: str | None = None
) -> bytes:
    """(C, S) float PCM encoded by FFmpeg."""
    step = 4096
    return _encode(
        (pcm[:, i : i + step] for i in range(0, pcm.shape[1], step)), rate_hz, codec, container, layout
    )


def _encode(
    chunks: Iterable[np.ndarray], rate_hz: int, codec: str, container: str, layout: str | None
) -> bytes:
    """The frames go in as packed float and FFmpeg converts them (PyAV cannot even make a planar
    frame of 8 or more channels itself)."""
    out = io.BytesIO()
    with av.open(out, "w", format=container) as c:
        stream: Any = None
        for chunk in chunks:
            channels = chunk.shape[0]
            if stream is None:
                layout = layout or {1: "mono", 2: "stereo"}.get(channels, f"{channels} channels")
                stream = c.add_stream(codec, rate=rate_hz, layout=layout)
                resampler = av.AudioResampler(format=stream.format, layout=layout, rate=rate_hz)
                pts = 0
            packed = np.ascontiguousarray(chunk.T, np.float32).reshape(1, -1)
            frame = av.AudioFrame.from_ndarray(packed, format="flt", layout=layout)
            frame.sample_rate, frame.pts = rate_hz, pts
            pts += chunk.shape[1]
            for converted in resampler.resample(frame):
                c.mux(stream.encode(converted))
        c.mux(stream.encode(None))
    return out.getvalue()


def multichannel_wav(channels: int, samples: int = 100) -> bytes:
    """The 1.6 KB WAV of 8 channels (or more) whose decoding segfaulted the gateway."""
    return encoded(np.tile(clip(samples / RATE_HZ)[:samples], (channels, 1)), RATE_HZ)


def float_wav(pcm: np.ndarray, rate_hz: int = RATE_HZ) -> bytes:
    """32-bit float WAV: the one format that carries NaN, infinity and 1e30 as they are."""
    return encoded(pcm[None], rate_hz, codec="pcm_f32le")


def flac_at(rate_hz: int, seconds: float) -> bytes:
    """FLAC at any rate it can say (up to 655,350 Hz): 29 s at that rate is 15 KB and 19 M samples."""
    step = 65_536
    n = round(rate_hz * seconds)
    chunks = (np.zeros((1, min(step, n - i)), np.float32) for i in range(0, n, step))
    return _encode(chunks, rate_hz, "flac", "flac", None)


def planar_71_aac(seconds: float = 1.0) -> bytes:
    """7.1 AAC: FFmpeg decodes it to planar float frames of 8 channels, the frames whose
    ``to_ndarray`` segfaults PyAV."""
    return encoded(np.tile(clip(seconds), (8, 1)), RATE_HZ, codec="aac", container="matroska", layout="7.1")
