"""The HTTP API through the real ``openai`` client: models, streamed speech (raw and SSE events),
voices, and the requests a benchmark harness sends (``/health``, ``voice: "Ryan"``, ``stream``)."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import av
import numpy as np
import openai
import pytest

from tests.asr import transcribe, wer
from tests.conftest import running_gateway
from voicewire.engine import Engine
from voicewire.realtime.auth import AuthConfig
from voicewire.realtime.http_api import parse_speech, resolve_voice

KEY = "k" * 24
TEXT = "The quick brown fox jumps over the lazy dog."


@pytest.fixture
async def authed(engine: Engine) -> AsyncIterator[str]:
    async with running_gateway(engine, auth=AuthConfig(api_keys=(KEY,))) as base:
        yield base


def _client(base: str, key: str = KEY) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"http://{base}/v1", api_key=key, max_retries=0)


def _rms(pcm: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(pcm.astype(np.float64) / 32768.0))))


async def test_models_list_names_the_served_model(authed: str, engine: Engine) -> None:
    models = await _client(authed).models.list()
    assert [(m.id, m.object, m.owned_by) for m in models.data] == [(engine.info.name, "model", "voicewire")]
    with pytest.raises(openai.AuthenticationError):
        await _client(authed, "x" * 24).models.list()


async def test_raw_pcm_and_wav_stream_through_with_streaming_response(authed: str) -> None:
    client = _client(authed)
    pcm = bytearray()
    async with client.audio.speech.with_streaming_response.create(
        model="tts-1", voice="alloy", input=TEXT, response_format="pcm"
    ) as resp:
        assert resp.headers["content-type"] == "audio/pcm"
        assert resp.headers["x-sample-rate"] == "24000"
        async for chunk in resp.iter_bytes():
            pcm += chunk
    samples = np.frombuffer(bytes(pcm), "<i2")
    assert samples.size > 24_000 and _rms(samples) > 0.01  # over a second of audible speech
    async with client.audio.speech.with_streaming_response.create(
        model="tts-1", voice="alloy", input=TEXT, response_format="wav"
    ) as resp:
        wav = await resp.read()
    assert wav[:4] == b"RIFF" and int.from_bytes(wav[24:28], "little") == 24_000
    assert abs(len(wav) - 44 - len(pcm)) < 0.2 * len(pcm)  # the same utterance, sampled again


async def test_write_to_file_writes_a_playable_mp3_by_default(authed: str, tmp_path: Path) -> None:
    # No response_format: OpenAI's default, mp3, is what a script that saves "x.mp3" expects.
    path = tmp_path / "x.mp3"
    speech = await _client(authed).audio.speech.create(model="tts-1", voice="alloy", input=TEXT)
    assert speech.response.headers["content-type"] == "audio/mpeg"
    speech.write_to_file(path)
    with av.open(str(path)) as container:
        assert container.format.name == "mp3"
        pcm = np.concatenate([f.to_ndarray().reshape(-1) for f in container.decode(audio=0)])
        rate = container.streams.audio[0].rate
    assert rate == 24_000 and pcm.size > rate  # over a second of speech
    assert wer(TEXT, transcribe(pcm.astype(np.float32), rate)) <= 0.15


async def test_sse_events_decode_back_to_the_pcm_stream(authed: str) -> None:
    client = _client(authed)
    events = []
    async with client.audio.speech.with_streaming_response.create(
        model="tts-1", voice="alloy", input=TEXT, response_format="pcm", stream_format="sse"
    ) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        async for line in resp.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
    kinds = [e["type"] for e in events]
    assert len(kinds) >= 2 and set(kinds[:-1]) == {"speech.audio.delta"} and kinds[-1] == "speech.audio.done"
    pcm = np.frombuffer(b"".join(base64.b64decode(e["audio"]) for e in events[:-1]), "<i2")
    assert pcm.size > 24_000 and _rms(pcm) > 0.01
    usage = events[-1]["usage"]
    assert usage["input_tokens"] == len(TEXT) and usage["output_tokens"] > 0
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


async def test_sse_wav_deltas_concatenate_to_a_wav_file(authed: str) -> None:
    async with _client(authed).audio.speech.with_streaming_response.create(
        model="tts-1", voice="alloy", input="Hello there.", response_format="wav", stream_format="sse"
    ) as resp:
        lines = [line async for line in resp.iter_lines() if line.startswith("data: ")]
    audio = b"".join(base64.b64decode(e["audio"]) for e in map(json.loads, (x[6:] for x in lines[:-1])))
    assert audio[:4] == b"RIFF" and len(audio) > 44 + 4800


async def test_unknown_stream_format_is_refused(authed: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        await _client(authed).audio.speech.create(
            model="tts-1",
            voice="alloy",
            input="hi",
            extra_body={"stream_format": "mp3-frames"},
        )
    assert err.value.code == "unsupported_stream_format"


async def test_health_is_open_and_voices_need_the_key(authed: str, engine: Engine) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://{authed}/health") as resp:
            assert resp.status == 200 and (await resp.json())["status"] == "ok"
        async with http.get(f"http://{authed}/v1/audio/voices") as resp:
            assert resp.status == 401
        headers = {"Authorization": f"Bearer {KEY}"}
        async with http.get(f"http://{authed}/v1/audio/voices", headers=headers) as resp:
            body = await resp.json()
    assert body["object"] == "list"
    assert [v["id"] for v in body["data"]] == list(engine.info.voices) == ["heart"]
    assert body["data"][0]["default"] is True


async def test_a_benchmark_harness_request_streams_pcm(authed: str) -> None:
    # What Nari Labs tts_bench's OpenAI-speech targets send.
    body = {
        "model": "qwen3-tts",
        "input": TEXT,
        "voice": "Ryan",
        "language": "English",
        "stream": True,
        "non_streaming_mode": False,
        "response_format": "pcm",
    }
    headers = {"Authorization": f"Bearer {KEY}"}
    url = f"http://{authed}/v1/audio/speech"
    async with aiohttp.ClientSession() as http, http.post(url, json=body, headers=headers) as resp:
        assert resp.status == 200 and resp.headers["Content-Type"] == "audio/pcm"
        data = await resp.read()
    assert len(data) > 2 * 24_000


def test_voice_names_resolve_case_insensitively_or_to_the_default() -> None:
    qwen = ("ryan", "aiden", "vivian", "serena")
    assert resolve_voice("Ryan", qwen) == "ryan"
    assert resolve_voice("Ryan", ("heart",)) == ""  # a Qwen3 speaker on a model without it
    assert resolve_voice("ALLOY", qwen) == ""
    assert resolve_voice("HEART", ("heart",)) == "heart"
    with pytest.raises(ValueError, match="invalid_voice"):
        resolve_voice("fenrir", ("heart",))


def test_harness_fields_reach_the_stream_params() -> None:
    req = parse_speech(
        {"input": "hi", "language": "English", "instructions": "whisper", "non_streaming_mode": True},
        ("heart",),
        100,
    )
    assert req.params.language == "English"
    assert req.params.extra == {"instruct": "whisper", "whole_text": True}
    assert not req.sse and req.fmt == "mp3"  # OpenAI's default
    for bad, code in [
        ({"input": "hi", "stream": "yes"}, "invalid_stream"),
        ({"input": "hi", "language": 3}, "invalid_language"),
        ({"input": "hi", "stream_format": "ogg"}, "unsupported_stream_format"),
    ]:
        with pytest.raises(ValueError, match=code):
            parse_speech(bad, ("heart",), 100)
