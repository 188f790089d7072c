"""Word timings on ``POST /v1/audio/speech``: ``speech.audio.words`` events before the audio that
holds each word's start (SSE with ``timestamps``), and one JSON answer with the whole audio and
its words (``stream_format: "json"``, what ElevenLabs' /with-timestamps answers)."""

from __future__ import annotations

import base64
import json

import aiohttp
import numpy as np
import pytest

pytestmark = pytest.mark.shared_cores  # word times in the audio, not wall time: nothing timed

TEXT = "Timings let an agent know which words were heard."


def _events(body: bytes) -> list[dict[str, object]]:
    return [json.loads(line[6:]) for line in body.decode().split("\n\n") if line.startswith("data: ")]


def _check_words(words: list[dict[str, object]], audio_ms: float) -> None:
    assert [TEXT[int(w["char_start"]) : int(w["char_end"])] for w in words] == TEXT.split()  # type: ignore[call-overload]
    starts = [float(w["start_ms"]) for w in words]  # type: ignore[arg-type]
    assert starts == sorted(starts) and 0 <= starts[0] < 500 and starts[-1] < audio_ms
    assert all(float(w["end_ms"]) > float(w["start_ms"]) for w in words)  # type: ignore[arg-type]


async def test_sse_with_timestamps_sends_each_word_before_its_audio(gateway: str) -> None:
    body = {"input": TEXT, "response_format": "pcm", "stream_format": "sse", "timestamps": True}
    async with aiohttp.ClientSession() as http, http.post(f"http://{gateway}/v1/audio/speech", json=body) as r:
        assert r.status == 200
        events = _events(await r.read())
    words: list[dict[str, object]] = []
    pcm = b""
    for e in events:
        if e["type"] == "speech.audio.words":
            for w in e["words"]:  # type: ignore[attr-defined]
                assert float(w["start_ms"]) >= len(pcm) / 2 / 24  # not before the audio already sent
            words += e["words"]  # type: ignore[arg-type]
        elif e["type"] == "speech.audio.delta":
            pcm += base64.b64decode(str(e["audio"]))
    assert events[-1]["type"] == "speech.audio.done"
    _check_words(words, len(pcm) / 2 / 24)
    # without timestamps the stream is OpenAI's: audio deltas and done only
    async with aiohttp.ClientSession() as http, http.post(
        f"http://{gateway}/v1/audio/speech", json={**body, "timestamps": False}
    ) as r:
        assert {e["type"] for e in _events(await r.read())} == {"speech.audio.delta", "speech.audio.done"}


async def test_json_answers_the_whole_audio_with_its_words(gateway: str) -> None:
    body = {"input": TEXT, "response_format": "pcm", "stream_format": "json"}
    async with aiohttp.ClientSession() as http, http.post(f"http://{gateway}/v1/audio/speech", json=body) as r:
        assert r.status == 200 and r.content_type == "application/json"
        answer = await r.json()
    pcm = np.frombuffer(base64.b64decode(answer["audio"]), "<i2")
    assert answer["content_type"] == "audio/pcm" and answer["sample_rate"] == 24_000 and pcm.size > 24_000
    _check_words(answer["words"], pcm.size / 24)
    async with aiohttp.ClientSession() as http, http.post(
        f"http://{gateway}/v1/audio/speech", json={"input": TEXT, "timestamps": True}
    ) as r:
        assert r.status == 400 and (await r.json())["error"]["code"] == "invalid_timestamps"
