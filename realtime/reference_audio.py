"""A voice upload's reference clip: any container and codec FFmpeg reads (PyAV) -> float32 mono.

FFmpeg runs in a child process (``reference_decoder.py``): a file that crashes it costs its own
upload a 422, not the gateway. Every way an upload can be unusable has a stable code (the HTTP
API answers with it):

| code | status | when |
|---|---|---|
| ``upload_too_large`` | 413 | the file is over ``max_bytes`` (checked before anything is decoded) |
| ``not_audio`` | 400 | FFmpeg cannot open it, or it has no audio stream, or no sample decodes |
| ``unsupported_channels`` | 400 | more than ``max_channels`` (2) channels; refused before decoding |
| ``unsupported_sample_rate`` | 400 | a rate outside ``min_sample_rate_hz``-``max_sample_rate_hz`` (8-192 kHz); refused before decoding |
| ``audio_too_long`` | 400 | over ``max_duration_s`` in decoded samples; decoding stops there (a small file may hold hours) |
| ``audio_too_short`` | 400 | under ``min_duration_s``: too little of a voice to clone |
| ``non_finite_audio`` | 400 | a NaN or infinite sample (a float file) |
| ``audio_silent`` | 400 | no 10 ms window above the engine's onset level (-45 dBFS) |
| ``undecodable_audio`` | 422 | the decoder process crashed, failed, or ran past ``decode_timeout_s`` (10 s) |

Samples beyond full scale (a float file or a lossy codec's overshoot) are clipped to [-1, 1]
and counted (``ReferenceAudio.clipped_samples``): a hot MP3 is a usable reference, refusing it
would not help its sender. Channels are averaged and the clip's own rate is kept: the cloner
resamples once, as the reference implementation does, so the same file gives the same voice
however it was uploaded.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from voicewire.engine import ONSET_THRESHOLD_DBFS, first_audible_sample

from .reference_decoder import DECODER_COMMAND, BadAudio, DecodeLimits, decode_in_process

__all__ = ["BadAudio", "ReferenceAudio", "ReferenceLimits", "decode_reference"]

MAX_UPLOAD_BYTES = 10 * 1024 * 1024  # a 30 s WAV at 48 kHz stereo is 5.8 MB
MAX_DURATION_S = 30.0  # Qwen3-TTS clones from 3-10 s; longer only costs prompt positions
MIN_DURATION_S = 1.0
MAX_CHANNELS = 2  # mono or stereo: a voice is one source; 8 or more crashed PyAV (reference_decoder.py)
MIN_SAMPLE_RATE_HZ = 8_000  # telephone speech; below it no cloner gets a voice out of it
MAX_SAMPLE_RATE_HZ = 192_000  # studio rates; a 655 kHz FLAC of 15 KB decoded to 19 M samples
DECODE_TIMEOUT_S = 10.0  # a 30 s clip decodes in well under a second, with the child's start
MAX_VOICES = 1000  # stored voices in all: a few KB each on disk, all loaded at start
MAX_VOICES_PER_CLIENT = 20
MAX_UPLOADS = 4  # uploads read, decoded and cloned at once (the engine clones one at a time)
MAX_UPLOADS_PER_CLIENT = 2  # so one client cannot hold every upload slot


@dataclass(frozen=True)
class ReferenceLimits:
    """What a voice upload may be (``reference_audio.py``) and what one client may hold
    (``voices_api.py``, ``voices.py``)."""

    max_bytes: int = MAX_UPLOAD_BYTES
    max_duration_s: float = MAX_DURATION_S
    min_duration_s: float = MIN_DURATION_S
    max_channels: int = MAX_CHANNELS
    min_sample_rate_hz: int = MIN_SAMPLE_RATE_HZ
    max_sample_rate_hz: int = MAX_SAMPLE_RATE_HZ
    decode_timeout_s: float = DECODE_TIMEOUT_S
    # The decoder process's command line; the file's limits follow as its one argument. A prefix
    # can put it in a sandbox (nsjail, bwrap) without the gateway in there too.
    decoder_command: tuple[str, ...] = DECODER_COMMAND
    max_voices: int = MAX_VOICES  # -> 507 voice_store_full
    max_voices_per_client: int = MAX_VOICES_PER_CLIENT  # -> 429 voice_quota_exceeded; 0: none
    max_uploads: int = MAX_UPLOADS  # -> 503 too_many_requests
    max_uploads_per_client: int = MAX_UPLOADS_PER_CLIENT  # -> 429 quota_exceeded; 0: none

    def __post_init__(self) -> None:
        if not 0 < self.min_duration_s <= self.max_duration_s:
            raise ValueError("reference durations must satisfy 0 < min_duration_s <= max_duration_s")
        if not 0 < self.min_sample_rate_hz <= self.max_sample_rate_hz:
            raise ValueError(
                "reference sample rates must satisfy 0 < min_sample_rate_hz <= max_sample_rate_hz"
            )
        for name in ("max_bytes", "max_channels", "max_voices", "max_uploads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.max_voices_per_client < 0 or self.max_uploads_per_client < 0:
            raise ValueError("per-client voice limits must be >= 0 (0: none per client)")
        if self.decode_timeout_s <= 0 or not self.decoder_command:
            raise ValueError("the decoder needs a command and a positive timeout")

    @property
    def decode_limits(self) -> DecodeLimits:
        return DecodeLimits(
            self.max_duration_s, self.max_channels, self.min_sample_rate_hz, self.max_sample_rate_hz
        )


@dataclass(frozen=True)
class ReferenceAudio:
    pcm: np.ndarray  # (S,) float32 mono, within [-1, 1]
    sample_rate_hz: int
    clipped_samples: int = 0  # samples that were beyond full scale and were clipped

    @property
    def duration_s(self) -> float:
        return self.pcm.size / self.sample_rate_hz


async def decode_reference(data: bytes, limits: ReferenceLimits) -> ReferenceAudio:
    """Raises BadAudio. The decoding runs in a child process; the checks after it take a few ms."""
    if len(data) > limits.max_bytes:
        raise BadAudio(413, "upload_too_large", f"reference audio is limited to {limits.max_bytes} bytes")
    pcm, rate = await decode_in_process(
        data, limits.decode_limits, limits.decoder_command, limits.decode_timeout_s
    )
    duration_s = pcm.size / rate
    if duration_s > limits.max_duration_s:
        raise BadAudio(400, "audio_too_long", f"reference audio is limited to {limits.max_duration_s:g} s")
    if duration_s < limits.min_duration_s:
        raise BadAudio(
            400,
            "audio_too_short",
            f"reference audio must be at least {limits.min_duration_s:g} s, this is {duration_s:.2f} s",
        )
    if not np.isfinite(pcm).all():
        raise BadAudio(400, "non_finite_audio", "the reference audio holds NaN or infinite samples")
    clipped = int(np.count_nonzero(np.abs(pcm) > 1.0))
    if clipped:
        pcm = np.clip(pcm, -1.0, 1.0)
    if first_audible_sample(pcm, rate, ONSET_THRESHOLD_DBFS) is None:
        raise BadAudio(
            400, "audio_silent", f"the reference audio has no sound above {ONSET_THRESHOLD_DBFS:g} dBFS"
        )
    return ReferenceAudio(pcm, rate, clipped)
