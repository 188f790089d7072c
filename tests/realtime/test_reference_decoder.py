"""Reference clips decoded in a child process: the hostile files an attacker uploaded, and decoders
that crash or hang (real processes that really segfault or sleep)."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time

import numpy as np
import psutil
import pytest

from tests.realtime.voice_clips import (
    RATE_HZ,
    clip,
    flac_at,
    float_wav,
    multichannel_wav,
    planar_71_aac,
    wav_bytes,
)
from voicewire.realtime.reference_audio import BadAudio, ReferenceLimits, decode_reference

SEGFAULT = (
    sys.executable,
    "-c",
    "import os, signal, sys; sys.stdin.buffer.read(); os.kill(os.getpid(), signal.SIGSEGV)",
)
HANG = (sys.executable, "-c", "import time; time.sleep(60)")


DEFAULTS = ReferenceLimits()


async def refused(data: bytes, limits: ReferenceLimits = DEFAULTS) -> BadAudio:
    with pytest.raises(BadAudio) as info:
        await decode_reference(data, limits)
    return info.value


def decoders_alive() -> list[psutil.Process]:
    """The hanging decoders this test process has started and not yet reaped."""
    alive = []
    for p in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if p.status() != psutil.STATUS_ZOMBIE and HANG[-1] in p.cmdline():
                alive.append(p)
    return alive


@pytest.mark.parametrize("channels", [8, 64])
async def test_a_file_of_many_channels_is_refused_before_decoding(channels: int) -> None:
    """8 channels in 1.6 KB segfaulted the gateway (PyAV's to_ndarray of a planar frame)."""
    err = await refused(multichannel_wav(channels))
    assert (err.status, err.code) == (400, "unsupported_channels")
    assert f"this has {channels}" in err.message


async def test_planar_frames_of_eight_channels_decode_safely() -> None:
    """Where more channels are allowed, 7.1 AAC (planar float frames of 8 channels) is averaged
    to mono through packed frames instead of crashing."""
    ref = await decode_reference(planar_71_aac(1.5), ReferenceLimits(max_channels=8))
    assert ref.sample_rate_hz == RATE_HZ and 1.4 < ref.duration_s < 1.7
    assert np.isfinite(ref.pcm).all() and 0.1 < np.abs(ref.pcm).max() <= 1.0


@pytest.mark.parametrize(
    "audio",
    [
        flac_at(655_350, 29.0),
        wav_bytes(np.full(30, 0.3, np.float32), 1),
        wav_bytes(np.full(30, 0.3, np.float32), 7),
    ],
    ids=["flac-655350hz-29s", "wav-1hz", "wav-7hz"],
)
async def test_rates_outside_8_to_192_khz_are_refused_before_decoding(audio: bytes) -> None:
    """15 KB of FLAC at 655,350 Hz held 19 M samples (~150-200 MB decoded per upload)."""
    t0 = time.perf_counter()
    err = await refused(audio)
    assert (err.status, err.code) == (400, "unsupported_sample_rate")
    assert time.perf_counter() - t0 < 5.0  # the child's start; nothing was decoded


async def test_length_is_counted_in_decoded_samples_at_the_clips_rate() -> None:
    err = await refused(flac_at(192_000, 2.5), ReferenceLimits(max_duration_s=2.0))
    assert (err.status, err.code) == (400, "audio_too_long")
    assert (
        await decode_reference(wav_bytes(clip(2.0, 192_000), 192_000), DEFAULTS)
    ).sample_rate_hz == 192_000


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
async def test_non_finite_samples_are_refused(bad: float) -> None:
    pcm = clip(2.0)
    pcm[1000:1010] = bad
    err = await refused(float_wav(pcm))
    assert (err.status, err.code) == (400, "non_finite_audio")


async def test_samples_beyond_full_scale_are_clipped_and_counted() -> None:
    ref = await decode_reference(float_wav(clip(2.0) * 1e30), DEFAULTS)
    assert ref.clipped_samples > 0.9 * ref.pcm.size
    assert np.isfinite(ref.pcm).all() and np.abs(ref.pcm).max() == 1.0


async def test_a_decoder_that_crashes_costs_only_its_own_clip() -> None:
    err = await refused(wav_bytes(clip(2.0)), ReferenceLimits(decoder_command=SEGFAULT))
    assert (err.status, err.code) == (422, "undecodable_audio") and "SIGSEGV" in err.message
    ref = await decode_reference(wav_bytes(clip(2.0)), DEFAULTS)  # the next one decodes
    assert ref.duration_s == pytest.approx(2.0)


async def test_a_decoder_that_hangs_is_killed_at_its_timeout() -> None:
    t0 = time.perf_counter()
    err = await refused(wav_bytes(clip(2.0)), ReferenceLimits(decoder_command=HANG, decode_timeout_s=0.5))
    assert (err.status, err.code) == (422, "undecodable_audio")
    assert time.perf_counter() - t0 < 3.0
    assert decoders_alive() == []


async def test_a_cancelled_upload_kills_its_decoder() -> None:
    task = asyncio.create_task(decode_reference(wav_bytes(clip(2.0)), ReferenceLimits(decoder_command=HANG)))
    deadline = time.monotonic() + 5.0
    while not decoders_alive() and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert decoders_alive(), "the decoder did not start"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert decoders_alive() == []
