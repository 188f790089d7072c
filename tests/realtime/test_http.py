"""POST /v1/audio/speech (OpenAI-compatible, streamed) and GET /healthz on the real gateway."""

from __future__ import annotations

import io
import json
import time
import wave

import aiohttp
import numpy as np
import pytest

from tests.asr import transcribe, wer

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Can you tell me the way to the nearest train station?",
    "In 2024, the company hired 150 new engineers.",
    "Well, that's interesting; I never thought about it that way!",
    "Please call me back at 5 o'clock, if you can.",
]


async def _speech(base: str, body: object) -> tuple[int, bytes, dict[str, str], list[float]]:
    async with aiohttp.ClientSession() as http:
        t0 = time.perf_counter()
        async with http.post(f"http://{base}/v1/audio/speech", json=body) as resp:
            data = bytearray()
            arrivals: list[float] = []
            async for chunk in resp.content.iter_any():
                data += chunk
                arrivals.append(time.perf_counter() - t0)
            return resp.status, bytes(data), dict(resp.headers), arrivals


def _wav_pcm(data: bytes) -> tuple[np.ndarray, int]:
    # The streamed header carries unknown (maximal) sizes: read the fmt chunk, take the data as is.
    assert data[:4] == b"RIFF" and data[8:12] == b"WAVE"
    rate = int.from_bytes(data[24:28], "little")
    assert data[36:40] == b"data"
    return np.frombuffer(data[44:], "<i2").astype(np.float32) / 32768.0, rate


async def test_speech_wav_and_pcm_are_intelligible(gateway: str) -> None:
    hyps = []
    for i, text in enumerate(SENTENCES):
        fmt = "wav" if i % 2 == 0 else "pcm"
        status, data, headers, _ = await _speech(
            gateway, {"model": "tts-1", "input": text, "voice": "alloy", "response_format": fmt}
        )
        assert status == 200, data
        if fmt == "wav":
            assert headers["Content-Type"] == "audio/wav"
            pcm, rate = _wav_pcm(data)
        else:
            assert headers["Content-Type"] == "audio/pcm"
            pcm, rate = np.frombuffer(data, "<i2").astype(np.float32) / 32768.0, 24_000
        assert rate == 24_000
        hyps.append(transcribe(pcm, rate))
    score = wer(" ".join(SENTENCES), " ".join(hyps))
    assert score <= 0.15, list(zip(SENTENCES, hyps, strict=True))


async def test_speech_body_streams_before_the_utterance_is_finished(gateway: str) -> None:
    text = " ".join(SENTENCES * 3)
    status, _, headers, arrivals = await _speech(gateway, {"input": text, "response_format": "pcm"})
    assert status == 200 and headers.get("Transfer-Encoding") == "chunked"
    assert len(arrivals) >= 5
    assert arrivals[0] < arrivals[-1] / 3, f"first bytes at {arrivals[0]:.3f} s, last at {arrivals[-1]:.3f} s"


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ("not json", 400, "invalid_json"),
        ([1, 2], 400, "invalid_body"),
        ({"model": "tts-1"}, 400, "invalid_input"),
        ({"input": "   "}, 400, "invalid_input"),
        ({"input": "hi", "voice": "fenrir"}, 400, "invalid_voice"),
        ({"input": "hi", "voice": 3}, 400, "invalid_voice"),
        ({"input": "hi", "response_format": "wma"}, 400, "unsupported_format"),
        ({"input": "hi", "speed": 5}, 400, "invalid_speed"),
        ({"input": "hi", "speed": "fast"}, 400, "invalid_speed"),
        ({"input": "x" * 5000}, 400, "input_too_long"),
        ({"input": "x" * 70_000}, 413, "body_too_large"),
    ],
)
async def test_bad_speech_bodies_get_4xx_json(gateway: str, body: object, status: int, code: str) -> None:
    async with aiohttp.ClientSession() as http:
        payload = body if isinstance(body, str) else json.dumps(body)
        async with http.post(
            f"http://{gateway}/v1/audio/speech", data=payload, headers={"Content-Type": "application/json"}
        ) as resp:
            assert resp.status == status
            err = await resp.json()
            assert err["error"]["code"] == code


async def test_healthz(gateway: str) -> None:
    async with aiohttp.ClientSession() as http, http.get(f"http://{gateway}/healthz") as resp:
        assert resp.status == 200
        body = await resp.json()
        assert body["status"] == "ok" and body["model"] == "hibari" and body["sample_rate"] == 24_000


def test_wav_helper_rejects_garbage() -> None:
    with pytest.raises(AssertionError):
        _wav_pcm(b"garbage" * 10)
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(24_000)
        w.writeframes(b"\x00\x00" * 10)
    pcm, rate = _wav_pcm(buf.getvalue())
    assert rate == 24_000 and pcm.size == 10
