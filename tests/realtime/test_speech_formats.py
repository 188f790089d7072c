"""``POST /v1/audio/speech`` in every response format: each decodes with PyAV (FFmpeg's decoders,
not our encoders' own view), is intelligible to the offline ASR, and streams as it is produced."""

from __future__ import annotations

import io

import av
import numpy as np
import pytest

from tests.asr import transcribe, wer
from tests.realtime.test_http import SENTENCES, _speech
from voicewire.realtime.http_api import parse_speech

pytestmark = pytest.mark.shared_cores  # formats and what Whisper hears: nothing timed
TEXT = " ".join(SENTENCES)
ENGINE_RATE_HZ = 24_000

# response_format -> (Content-Type, the rate it decodes at, PyAV's demuxer for a headerless format)
FORMATS = {
    "mp3": ("audio/mpeg", 24_000, None),
    "opus": ("audio/ogg", 48_000, None),  # Opus decodes at 48 kHz whatever it was encoded at
    "aac": ("audio/aac", 24_000, None),
    "flac": ("audio/flac", 24_000, None),
    "wav": ("audio/wav", 24_000, None),
    "pcm": ("audio/pcm", 24_000, "s16le"),
    "mulaw": ("audio/basic", 8_000, "mulaw"),
    "alaw": ("audio/x-alaw", 8_000, "alaw"),
}


def decode(data: bytes, demuxer: str | None, rate_hz: int) -> tuple[np.ndarray, int]:
    """Float mono samples and their rate, as FFmpeg reads ``data``."""
    options = {"sample_rate": str(rate_hz)} if demuxer else {}
    with av.open(io.BytesIO(data), format=demuxer, options=options) as container:
        to_float = av.AudioResampler(format="flt", layout="mono")
        frames = [out for f in container.decode(audio=0) for out in to_float.resample(f)]
    pcm = np.concatenate([f.to_ndarray().reshape(-1) for f in frames])
    return pcm, frames[0].sample_rate


@pytest.mark.parametrize("fmt", list(FORMATS))
async def test_every_format_decodes_with_pyav_and_is_intelligible(gateway: str, fmt: str) -> None:
    content_type, rate_hz, demuxer = FORMATS[fmt]
    status, data, headers, arrivals = await _speech(
        gateway, {"model": "tts-1", "input": TEXT, "voice": "alloy", "response_format": fmt}
    )
    assert status == 200, data
    assert headers["Content-Type"] == content_type and headers.get("Transfer-Encoding") == "chunked"
    pcm, decoded_rate_hz = decode(data, demuxer, rate_hz)
    assert decoded_rate_hz == rate_hz
    assert pcm.size > 5 * rate_hz  # the five sentences: over 5 s of audio
    hyp = transcribe(pcm, rate_hz)
    assert wer(TEXT, hyp) <= 0.15, hyp
    # Streamed as produced: the first bytes long before the last.
    assert len(arrivals) >= 5 and arrivals[0] < arrivals[-1] / 2, arrivals[:3]


async def test_mp3_is_the_default_as_in_openais_api(gateway: str) -> None:
    status, data, headers, _ = await _speech(gateway, {"input": "Hello there, this is the default."})
    assert status == 200 and headers["Content-Type"] == "audio/mpeg"
    with av.open(io.BytesIO(data)) as container:
        assert container.format.name == "mp3"
        assert sum(f.samples for f in container.decode(audio=0)) > ENGINE_RATE_HZ // 2


@pytest.mark.parametrize(
    ("alias", "content_type"),
    [
        ("ulaw", "audio/basic"),
        ("ulaw_8000", "audio/basic"),
        ("pcm_mulaw", "audio/basic"),
        ("alaw_8000", "audio/x-alaw"),
    ],
)
async def test_telephony_names_of_other_apis_are_accepted(
    gateway: str, alias: str, content_type: str
) -> None:
    status, data, headers, _ = await _speech(
        gateway, {"input": "Thanks for calling.", "response_format": alias}
    )
    assert status == 200 and headers["Content-Type"] == content_type and headers["X-Sample-Rate"] == "8000"
    assert len(data) > 4_000  # one byte per sample at 8 kHz: over half a second


def test_response_format_names() -> None:
    assert parse_speech({"input": "hi"}, ("heart",), 100).fmt == "mp3"
    assert parse_speech({"input": "hi", "response_format": "ulaw_8000"}, ("heart",), 100).fmt == "mulaw"
    assert parse_speech({"input": "hi", "response_format": "pcm_alaw"}, ("heart",), 100).fmt == "alaw"
    for bad in ("MP3", "mp3_44100_128", "ogg", "mulaw_16000"):
        with pytest.raises(ValueError, match="unsupported_format"):
            parse_speech({"input": "hi", "response_format": bad}, ("heart",), 100)
