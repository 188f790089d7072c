"""A voice upload's reference clip: any container and codec FFmpeg reads (PyAV) -> float32 mono.

Every way an upload can be unusable has a stable code (the HTTP API answers 4xx with it):

| code | status | when |
|---|---|---|
| ``upload_too_large`` | 413 | the file is over ``max_bytes`` (checked before anything is decoded) |
| ``not_audio`` | 400 | FFmpeg cannot open it, or it has no audio stream, or no sample decodes |
| ``audio_too_long`` | 400 | over ``max_duration_s``; decoding stops there (a small file may hold hours) |
| ``audio_too_short`` | 400 | under ``min_duration_s``: too little of a voice to clone |
| ``audio_silent`` | 400 | no 10 ms window above the engine's onset level (-45 dBFS) |

Channels are averaged and the clip's own rate is kept: the cloner resamples once, as the
reference implementation does, so the same file gives the same voice however it was uploaded.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import av
import numpy as np

from voicewire.engine import ONSET_THRESHOLD_DBFS, first_audible_sample

MAX_UPLOAD_BYTES = 10 * 1024 * 1024  # a 30 s WAV at 48 kHz stereo is 5.8 MB
MAX_DURATION_S = 30.0  # Qwen3-TTS clones from 3-10 s; longer only costs prompt positions
MIN_DURATION_S = 1.0


@dataclass(frozen=True)
class ReferenceLimits:
    max_bytes: int = MAX_UPLOAD_BYTES
    max_duration_s: float = MAX_DURATION_S
    min_duration_s: float = MIN_DURATION_S


@dataclass(frozen=True)
class ReferenceAudio:
    pcm: np.ndarray  # (S,) float32 mono
    sample_rate_hz: int

    @property
    def duration_s(self) -> float:
        return self.pcm.size / self.sample_rate_hz


class BadAudio(ValueError):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def decode_reference(data: bytes, limits: ReferenceLimits) -> ReferenceAudio:
    """Raises BadAudio; CPU work of a few ms per second of audio (run it off the event loop)."""
    if len(data) > limits.max_bytes:
        raise BadAudio(413, "upload_too_large", f"reference audio is limited to {limits.max_bytes} bytes")
    try:
        pcm, rate = _decode(data, limits.max_duration_s)
    except av.FFmpegError:
        raise BadAudio(400, "not_audio", "the file is not audio FFmpeg can read") from None
    duration_s = pcm.size / rate
    if duration_s > limits.max_duration_s:
        raise BadAudio(400, "audio_too_long", f"reference audio is limited to {limits.max_duration_s:g} s")
    if duration_s < limits.min_duration_s:
        raise BadAudio(
            400,
            "audio_too_short",
            f"reference audio must be at least {limits.min_duration_s:g} s, this is {duration_s:.2f} s",
        )
    if first_audible_sample(pcm, rate, ONSET_THRESHOLD_DBFS) is None:
        raise BadAudio(
            400, "audio_silent", f"the reference audio has no sound above {ONSET_THRESHOLD_DBFS:g} dBFS"
        )
    return ReferenceAudio(pcm, rate)


def _decode(data: bytes, max_duration_s: float) -> tuple[np.ndarray, int]:
    """(S,) float32 mono and its rate; stops one frame past ``max_duration_s``."""
    with av.open(io.BytesIO(data), mode="r") as container:
        if not container.streams.audio:
            raise BadAudio(400, "not_audio", "the file has no audio stream")
        stream = container.streams.audio[0]
        rate = int(stream.codec_context.sample_rate or 0)
        # planar float at the clip's own layout and rate: one (C, n) array per frame
        resampler = av.AudioResampler(format="fltp", rate=rate or None)
        parts: list[np.ndarray] = []
        samples = 0
        for frame in container.decode(stream):
            rate = rate or frame.sample_rate
            for out in resampler.resample(frame):
                mono = out.to_ndarray().astype(np.float32).mean(axis=0)
                parts.append(mono)
                samples += mono.size
            if rate and samples > max_duration_s * rate:
                break
        else:
            parts += [out.to_ndarray().astype(np.float32).mean(axis=0) for out in resampler.resample(None)]
    if not parts or not rate:
        raise BadAudio(400, "not_audio", "no audio could be decoded from the file")
    return np.concatenate(parts), rate
