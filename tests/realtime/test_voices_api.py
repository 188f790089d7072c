"""The voices API with real parts: ``voicewire serve`` with the tiny random Qwen3-TTS Base model in
an engine core, real HTTP and WebSocket clients, voices on disk across a restart; and an in-process
gateway for the refusals (bad audio, auth, a model that cannot clone).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import numpy as np
import pytest
import pytest_asyncio

from tests.conftest import free_port, running_gateway, speak_turn
from tests.realtime.voice_clips import RATE_HZ, TINY_BASE, clip, voice_form, wav_bytes
from voicewire.engine import Engine, EngineConfig
from voicewire.realtime.client import VoicewireClient
from voicewire.realtime.reference_audio import ReferenceLimits

REPO = Path(__file__).resolve().parents[2]
KEY = "test-key-0123456789"
module_loop = pytest.mark.asyncio(loop_scope="module")


# --- the server as a user runs it ------------------------------------------------------------------
@contextlib.contextmanager
def serve(voices_dir: Path) -> Iterator[str]:
    port = free_port()
    cmd = [
        sys.executable, "-m", "voicewire.realtime.cli", "serve", "--model", "qwen3-tts", "--random-weights",
        "--qwen-size", "tiny-base", "--max-streams", "4", "--max-seq-len", "256", "--port", str(port),
        "--voices-dir", str(voices_dir),
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            with contextlib.suppress(OSError):
                import urllib.request

                with urllib.request.urlopen(f"{base}/readyz", timeout=1) as r:
                    if r.status == 200:
                        break
            time.sleep(0.2)
        assert proc.poll() is None, proc.communicate()[0]
        yield base
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, out


async def clones_counted(http: aiohttp.ClientSession, base: str) -> float:
    """The engine core's clone counter as /metrics shows it. It crosses from the core with the
    heartbeat (every 0.5 s), so this waits for it to hold still over three of them."""
    seen: list[float] = []
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        async with http.get(f"{base}/metrics") as r:
            text = await r.text()
        m = re.search(r'^voicewire_engine_voices_cloned_total\{replica="0"\} (\S+)$', text, re.M)
        assert m is not None, text
        seen.append(float(m.group(1)))
        if len(seen) >= 4 and len(set(seen[-4:])) == 1:
            return seen[-1]
        await asyncio.sleep(0.5)
    raise AssertionError(f"the clone counter did not settle: {seen}")


async def test_an_uploaded_voice_survives_a_restart_and_speaks(tmp_path: Path) -> None:
    voices_dir = tmp_path / "voices"
    reference = wav_bytes(clip(2.0))
    async with aiohttp.ClientSession() as http:
        with serve(voices_dir) as base:
            t0 = time.perf_counter()
            async with http.post(f"{base}/v1/audio/voices", data=voice_form("Alice", reference, "Hello world.")) as r:
                first = await r.json()
                assert r.status == 201, first
            first_s = time.perf_counter() - t0
            assert first["created"] is True and first["id"].startswith("voice_") and first["in_context"]
            # the same reference again, under another name: found, not cloned again
            t0 = time.perf_counter()
            async with http.post(f"{base}/v1/audio/voices", data=voice_form("Bob", reference, "Hello world.")) as r:
                again = await r.json()
                assert r.status == 200, again
            again_s = time.perf_counter() - t0
            assert again["id"] == first["id"] and again["name"] == "Alice" and again["created"] is False
            assert await clones_counted(http, base) == 1.0
            print(f"upload: first {first_s * 1000:.0f} ms (cloned), same reference {again_s * 1000:.0f} ms")
            # an x-vector-only voice of the same audio is another voice
            async with http.post(f"{base}/v1/audio/voices", data=voice_form("Alice plain", reference)) as r:
                plain = await r.json()
                assert r.status == 201 and plain["id"] != first["id"] and not plain["in_context"], plain
        assert sorted(p.name for p in voices_dir.iterdir()) == sorted(
            f"{v['id']}{s}" for v in (first, plain) for s in (".json", ".safetensors")
        )
        with serve(voices_dir) as base:
            async with http.get(f"{base}/v1/audio/voices") as r:
                listed = await r.json()
            assert listed["cloning"] is True and listed["data"][0] == {
                "id": "default", "name": "default", "object": "voice", "type": "builtin", "default": True
            }  # fmt: skip
            assert [v["id"] for v in listed["data"][1:]] == [first["id"], plain["id"]]
            async with http.get(f"{base}/v1/audio/voices/alice") as r:  # names match case-insensitively
                assert r.status == 200 and (await r.json())["id"] == first["id"]
            # a WebSocket turn in the cloned voice (by name), through the engine core
            async with await VoicewireClient.connect(base, voice="Alice") as client:
                _, heard = await speak_turn(client, "Spoken in a cloned voice over the WebSocket.", 40)
            assert heard.done.reason == "completed" and len(heard.data) >= 10 * 1920 * 2
            # speech requests in it (by id): with a fixed seed the same voice gives the same audio
            # and another voice (the x-vector-only one, the model's default) other audio, so the
            # cloned voice is what speaks
            async def speak(voice: str | None) -> bytes:
                body = {"input": "And over HTTP as well.", "response_format": "pcm", "seed": 7}
                if voice is not None:
                    body["voice"] = voice
                async with http.post(f"{base}/v1/audio/speech", json=body) as r:
                    audio = await r.read()
                    assert r.status == 200, audio[:200]
                assert len(audio) >= 10 * 1920 * 2 and len(audio) % (1920 * 2) == 0
                return audio

            audio = await speak(first["id"])
            assert await speak("alice") == audio
            assert await speak(plain["id"]) != audio and await speak(None) != audio
            body = {"input": "And over HTTP as well.", "voice": first["id"]}
            # uploading the reference once more after the restart computes nothing either
            async with http.post(f"{base}/v1/audio/voices", data=voice_form("Alice", reference, "Hello world.")) as r:
                assert r.status == 200 and (await r.json())["id"] == first["id"]
            assert await clones_counted(http, base) == 0.0
            async with http.delete(f"{base}/v1/audio/voices/{first['id']}") as r:
                assert r.status == 200 and (await r.json())["deleted"] is True
            async with http.get(f"{base}/v1/audio/voices/{first['id']}") as r:
                assert r.status == 404 and (await r.json())["error"]["code"] == "voice_not_found"
            async with http.post(f"{base}/v1/audio/speech", json=body) as r:
                assert r.status == 400 and (await r.json())["error"]["code"] == "invalid_voice"
    assert not (voices_dir / f"{first['id']}.json").exists()


# --- refusals, in process --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def base_engine() -> Iterator[Engine]:
    engine = Engine(EngineConfig(model="qwen3-tts", model_options=dict(TINY_BASE))).start()
    yield engine
    engine.close()


LIMITS = ReferenceLimits(max_bytes=600_000, max_duration_s=10.0, min_duration_s=1.0)


@pytest_asyncio.fixture(loop_scope="module")
async def base_gateway(base_engine: Engine) -> AsyncIterator[str]:
    # behind a "proxy" (the test itself): X-Forwarded-For tells clients apart
    async with running_gateway(base_engine, voice_limits=LIMITS, trusted_proxies=("127.0.0.1",)) as base:
        yield f"http://{base}"


def _not_audio() -> bytes:
    return b"RIFF this is a text file that calls itself a WAV " * 200


@module_loop
@pytest.mark.parametrize(
    ("audio", "status", "code"),
    [
        (_not_audio(), 400, "not_audio"),
        (wav_bytes(clip(11.0)), 400, "audio_too_long"),  # 528 KB: under the byte limit
        (wav_bytes(clip(9.0, rate_hz=48_000)), 413, "upload_too_large"),  # 864 KB
        (wav_bytes(np.zeros(3 * RATE_HZ, np.float32)), 400, "audio_silent"),
        (wav_bytes(clip(3.0, level=0.001)), 400, "audio_silent"),  # -60 dBFS: hiss, not a voice
        (wav_bytes(clip(0.5)), 400, "audio_too_short"),
    ],
    ids=["not-audio", "too-long", "too-big", "digital-silence", "near-silence", "too-short"],
)
async def test_bad_uploads_get_stable_codes(
    base_gateway: str, base_engine: Engine, audio: bytes, status: int, code: str
) -> None:
    before = base_engine.stats.voices_cloned
    async with aiohttp.ClientSession() as http, http.post(
        f"{base_gateway}/v1/audio/voices", data=voice_form("bad", audio)
    ) as r:
        body = await r.json()
    assert (r.status, body["error"]["code"]) == (status, code), body
    assert base_engine.stats.voices_cloned == before


@module_loop
async def test_a_chunked_upload_is_cut_at_the_limit(base_gateway: str, base_engine: Engine) -> None:
    """No Content-Length to refuse up front: the reading stops at the byte limit."""
    with aiohttp.MultipartWriter("form-data") as writer:
        writer.append("big").set_content_disposition("form-data", name="name")
        audio = writer.append(wav_bytes(clip(9.0, rate_hz=48_000)), {"Content-Type": "audio/wav"})
        audio.set_content_disposition("form-data", name="audio", filename="big.wav")
    body = io.BytesIO()

    class Sink:
        async def write(self, data: bytes) -> None:
            body.write(data)

    await writer.write(Sink())  # type: ignore[arg-type]

    async def chunks() -> AsyncIterator[bytes]:
        data = body.getvalue()
        for i in range(0, len(data), 32 * 1024):
            yield data[i : i + 32 * 1024]

    before = base_engine.stats.voices_cloned
    headers = {"Content-Type": f"multipart/form-data; boundary={writer.boundary}"}
    async with aiohttp.ClientSession() as http, http.post(
        f"{base_gateway}/v1/audio/voices", data=chunks(), headers=headers
    ) as r:
        assert r.request_info.headers.get("Transfer-Encoding") == "chunked"
        assert (r.status, (await r.json())["error"]["code"]) == (413, "upload_too_large")
    assert base_engine.stats.voices_cloned == before


@module_loop
async def test_malformed_requests_are_refused(base_gateway: str) -> None:
    good = wav_bytes(clip(2.0, seed=3))
    async with aiohttp.ClientSession() as http:
        cases = [
            (voice_form("alloy", good), 409, "voice_name_taken"),  # an OpenAI name maps to the default
            (voice_form("", good), 400, "missing_field"),
            (voice_form("voice_123", good), 400, "invalid_name"),
        ]
        for form, status, code in cases:
            async with http.post(f"{base_gateway}/v1/audio/voices", data=form) as r:
                assert (r.status, (await r.json())["error"]["code"]) == (status, code)
        async with http.post(f"{base_gateway}/v1/audio/voices", json={"name": "x", "audio": "..."}) as r:
            assert (r.status, (await r.json())["error"]["code"]) == (415, "unsupported_media_type")
        async with http.post(f"{base_gateway}/v1/audio/speech", json={"input": "Hi.", "seed": -1}) as r:
            assert (r.status, (await r.json())["error"]["code"]) == (400, "invalid_seed")
        async with http.delete(f"{base_gateway}/v1/audio/voices/default") as r:
            assert (r.status, (await r.json())["error"]["code"]) == (400, "builtin_voice")
        async with http.post(f"{base_gateway}/v1/audio/voices", data=voice_form("Carol", good)) as r:
            carol = await r.json()
            assert r.status == 201, carol
        # another reference under a taken name
        async with http.post(f"{base_gateway}/v1/audio/voices", data=voice_form("carol", wav_bytes(clip(2.0, seed=4)))) as r:
            assert (r.status, (await r.json())["error"]["code"]) == (409, "voice_name_taken")


@module_loop
async def test_concurrent_uploads_of_one_reference_clone_once(base_gateway: str, base_engine: Engine) -> None:
    before = base_engine.stats.voices_cloned
    audio = wav_bytes(clip(2.5, seed=9))
    async with aiohttp.ClientSession() as http:

        async def upload(client: int) -> tuple[int, str]:
            headers = {"X-Forwarded-For": f"10.0.0.{client}"}  # a client uploads 2 at most at once
            async with http.post(f"{base_gateway}/v1/audio/voices", data=voice_form("Dana", audio), headers=headers) as r:
                return r.status, (await r.json())["id"]

        results = await asyncio.gather(*(upload(i) for i in range(4)))
    assert sorted(s for s, _ in results) == [200, 200, 200, 201] and len({i for _, i in results}) == 1
    assert base_engine.stats.voices_cloned == before + 1

    # two references under one name at once: one voice, one refusal
    async with aiohttp.ClientSession() as http:

        async def upload_other(seed: int) -> int:
            form = voice_form("Frank", wav_bytes(clip(2.0, seed=seed)))
            async with http.post(f"{base_gateway}/v1/audio/voices", data=form) as r:
                return r.status

        assert sorted(await asyncio.gather(upload_other(21), upload_other(22))) == [201, 409]


@module_loop
async def test_uploads_need_the_api_key_when_auth_is_on(base_engine: Engine) -> None:
    from voicewire.realtime.auth import AuthConfig

    audio = wav_bytes(clip(2.0, seed=11))
    async with running_gateway(base_engine, auth=AuthConfig(api_keys=(KEY,))) as base, aiohttp.ClientSession() as http:
        url = f"http://{base}/v1/audio/voices"
        async with http.post(url, data=voice_form("Eve", audio)) as r:
            assert r.status == 401, await r.text()
        async with http.get(url) as r:
            assert r.status == 401
        async with http.post(url, data=voice_form("Eve", audio), headers={"Authorization": f"Bearer {KEY}"}) as r:
            assert r.status == 201, await r.text()
    # a cross-site form post (a browser sends multipart without a preflight) is refused
    async with (
        running_gateway(base_engine, auth=AuthConfig(allowed_origins=("https://app.example",))) as base,
        aiohttp.ClientSession() as http,
        http.post(
            f"http://{base}/v1/audio/voices", data=voice_form("Eve", audio), headers={"Origin": "https://evil.example"}
        ) as r,
    ):
        assert r.status == 403, await r.text()


async def test_the_embedded_voice_lists_its_voice_and_refuses_cloning(engine: Engine) -> None:
    async with running_gateway(engine) as base, aiohttp.ClientSession() as http:
        async with http.get(f"http://{base}/v1/audio/voices") as r:
            listed = await r.json()
        assert listed["cloning"] is False
        assert listed["data"] == [
            {"id": v, "name": v, "object": "voice", "type": "builtin", "default": i == 0}
            for i, v in enumerate(engine.info.voices)
        ]
        async with http.post(f"http://{base}/v1/audio/voices", data=voice_form("Zed", wav_bytes(clip(2.0)))) as r:
            body = await r.json()
        assert r.status == 501 and body["error"]["code"] == "cloning_not_supported"
        assert engine.info.voices[0] in body["error"]["message"]


def test_a_broken_voice_file_is_skipped_at_start(tmp_path: Path) -> None:
    from voicewire.realtime.voices import VoiceStore

    (tmp_path / "voice_0123.json").write_text(json.dumps({"version": 1, "id": "voice_0123"}))
    (tmp_path / "voice_4567.json").write_text("{not json")
    assert VoiceStore(tmp_path).load() == 0
    assert os.listdir(tmp_path)  # nothing deleted: an operator may want to look
