"""Voice uploads the attacker's way, against a real gateway on 127.0.0.1 with the tiny random
Qwen3-TTS Base model (it clones): hostile files, a decoder that segfaults, floods of form parts,
parallel uploads, one client storing voice after voice, forms posted by another origin's page,
names that are too long or read as ids.

The gateway runs in this process, so its memory is this process's: a wave must leave the RSS
within 10% of where it started (the engine and the fixtures are loaded before the first reading).
"""

from __future__ import annotations

import asyncio
import gc
import json
import sys
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import psutil
import pytest

from tests.conftest import speak_turn
from tests.gateway.victim import victim_alongside
from tests.realtime.gateway import gateway
from tests.realtime.voice_clips import (
    TINY_BASE,
    clip,
    flac_at,
    float_wav,
    multichannel_wav,
    voice_form,
    wav_bytes,
)
from voicewire.engine import Engine, EngineConfig
from voicewire.realtime.auth import AuthConfig
from voicewire.realtime.client import VoicewireClient
from voicewire.realtime.gateway import GATEWAY
from voicewire.realtime.reference_audio import ReferenceLimits

pytestmark = pytest.mark.shared_cores  # refusals, slots and limits of uploads: nothing timed to the ms
SEGFAULT = (
    sys.executable,
    "-c",
    "import os, signal, sys; sys.stdin.buffer.read(); os.kill(os.getpid(), signal.SIGSEGV)",
)
BOUNDARY = "voicewire-test-boundary"
FORM = {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}
PROXIED = {"trusted_proxies": ("127.0.0.1",)}  # the test is the proxy: X-Forwarded-For names clients


@pytest.fixture(scope="module")
def base_engine() -> Iterator[Engine]:
    engine = Engine(EngineConfig(model="qwen3-tts", model_options=dict(TINY_BASE))).start()
    yield engine
    engine.close()


async def upload(
    http: aiohttp.ClientSession, url: str, data: Any, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, Any]]:
    async with http.post(f"{url}/v1/audio/voices", data=data, headers=headers) as r:
        return r.status, await r.json()


def code(answer: tuple[int, dict[str, Any]]) -> tuple[int, str]:
    status, body = answer
    return status, body["error"]["code"] if "error" in body else "ok"


def part(name: str, data: bytes, filename: str | None = None) -> bytes:
    disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
    return f"--{BOUNDARY}\r\nContent-Disposition: {disposition}\r\n\r\n".encode() + data + b"\r\n"


async def chunked(parts: Iterable[bytes]) -> AsyncIterator[bytes]:
    """A multipart body sent chunked (no Content-Length), a part per chunk."""
    for p in parts:
        yield p
    yield f"--{BOUNDARY}--\r\n".encode()


def rss_bytes() -> int:
    gc.collect()
    return int(psutil.Process().memory_info().rss)


# --- hostile files ---------------------------------------------------------------------------------
async def test_hostile_files_get_clean_refusals_and_the_gateway_answers_on(base_engine: Engine) -> None:
    nan_clip, inf_clip = clip(2.0), clip(2.0)
    nan_clip[100:200], inf_clip[100:200] = np.nan, np.inf
    cases = [
        (multichannel_wav(8), 400, "unsupported_channels"),  # 1.6 KB: it segfaulted the gateway
        (multichannel_wav(64), 400, "unsupported_channels"),
        (flac_at(655_350, 29.0), 400, "unsupported_sample_rate"),  # 15 KB, 19 M samples
        (wav_bytes(np.full(30, 0.3, np.float32), 1), 400, "unsupported_sample_rate"),
        (wav_bytes(np.full(30, 0.3, np.float32), 7), 400, "unsupported_sample_rate"),
        (float_wav(nan_clip), 400, "non_finite_audio"),
        (float_wav(inf_clip), 400, "non_finite_audio"),
    ]
    async with gateway(base_engine) as gw, aiohttp.ClientSession() as http:
        for audio, status, want in cases:
            assert code(await upload(http, gw.url, voice_form("hostile", audio))) == (status, want)
            async with http.get(f"{gw.url}/healthz") as r:
                assert r.status == 200
        # 1e30 samples are clipped to full scale: a voice, and a finite one
        status, body = await upload(http, gw.url, voice_form("Loud", float_wav(clip(2.0, seed=5) * 1e30)))
        assert status == 201, body
        voice = gw.app[GATEWAY].voices.find(body["id"], base_engine.info.voice_encoder)
        assert voice is not None and voice.cloned.finite


async def test_a_crashing_decoder_costs_only_its_upload(base_engine: Engine) -> None:
    """A decoder that really segfaults: the upload is a 422, a session mid-turn finishes its turn,
    and the gateway answers the requests after."""
    limits = ReferenceLimits(decoder_command=SEGFAULT)
    async with (
        gateway(base_engine, voice_limits=limits) as gw,
        aiohttp.ClientSession() as http,
        await VoicewireClient.connect(gw.url) as client,
    ):
        turn = asyncio.create_task(
            speak_turn(client, "A turn spoken while an upload crashes its decoder.", 40)
        )
        async with victim_alongside(gw.url.removeprefix("http://")):  # and new turns start on time
            status, body = await upload(http, gw.url, voice_form("Crash", wav_bytes(clip(2.0))))
        assert (status, body["error"]["code"]) == (422, "undecodable_audio") and "SIGSEGV" in body["error"][
            "message"
        ]
        _, heard = await turn
        assert heard.done.reason == "completed" and len(heard.data) > 0
        assert code(await upload(http, gw.url, voice_form("Crash", wav_bytes(clip(2.0))))) == (
            422,
            "undecodable_audio",
        )
        async with http.get(f"{gw.url}/v1/audio/voices") as r:
            assert r.status == 200


# --- the form --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("part_bytes", "status", "want"),
    [(8 * 1024, 413, "upload_too_large"), (1, 400, "too_many_parts")],
    ids=["8KB-parts", "1B-parts"],
)
async def test_a_flood_of_form_parts_is_cut_off(
    base_engine: Engine, part_bytes: int, status: int, want: str
) -> None:
    """100,000 parts on one chunked upload took the gateway from 98 to 867 MB."""
    blob = b"x" * part_bytes
    async with gateway(base_engine) as gw, aiohttp.ClientSession() as http:
        await upload(http, gw.url, voice_form("warm-up", b"not audio"))
        before = rss_bytes()
        flood = chunked(part(f"field{i}", blob) for i in range(100_000))
        async with victim_alongside(gw.url.removeprefix("http://")):
            t0 = time.perf_counter()
            assert code(await upload(http, gw.url, flood, FORM)) == (status, want)
            assert time.perf_counter() - t0 < 5.0
        assert rss_bytes() < 1.1 * before


async def test_parallel_uploads_take_their_slots_before_the_body(base_engine: Engine) -> None:
    """20 uploads of 10 MB at once, from 10 clients: 4 are read (the slots are taken before the
    body), 16 refused before a byte of audio is sent; memory goes back to where it was."""
    audio = wav_bytes(np.tile(clip(2.0), 104))[: 10 * 1024 * 1024 - 1024]  # 218 s: read, then refused
    send = asyncio.Event()

    async def body() -> AsyncIterator[bytes]:
        yield part("name", b"big") + part("audio", b"", "a.wav")[:-2]  # the audio part's head
        await send.wait()
        for i in range(0, len(audio), 256 * 1024):
            yield audio[i : i + 256 * 1024]
        yield f"\r\n--{BOUNDARY}--\r\n".encode()

    async with gateway(base_engine, **PROXIED) as gw, aiohttp.ClientSession() as http:
        await upload(http, gw.url, voice_form("warm-up", b"not audio"))
        before = rss_bytes()
        victim = victim_alongside(gw.url.removeprefix("http://"))
        await victim.__aenter__()
        uploads = [
            asyncio.create_task(upload(http, gw.url, body(), {**FORM, "X-Forwarded-For": f"10.0.0.{i % 10}"}))
            for i in range(20)
        ]
        deadline = time.monotonic() + 10.0
        while sum(u.done() for u in uploads) < 16 and time.monotonic() < deadline:
            await asyncio.wait(uploads, timeout=0.1, return_when=asyncio.FIRST_COMPLETED)
        refused = [code(u.result()) for u in uploads if u.done()]
        assert refused == [(503, "too_many_requests")] * 16
        send.set()
        answers = [code(a) for a in await asyncio.gather(*uploads)]
        await victim.__aexit__(None, None, None)  # its turns beside the uploads started on time
        assert sorted(answers).count((400, "audio_too_long")) == 4  # read whole and decoded
        gc.collect()
        assert rss_bytes() < 1.1 * before


async def test_one_client_cannot_hold_every_upload_slot(base_engine: Engine) -> None:
    send = asyncio.Event()

    async def body(seed: int) -> AsyncIterator[bytes]:
        yield part("name", f"slot {seed}".encode())
        await send.wait()
        yield part("audio", wav_bytes(clip(1.2, seed=seed)), "a.wav")
        yield f"--{BOUNDARY}--\r\n".encode()

    async with gateway(base_engine, **PROXIED) as gw, aiohttp.ClientSession() as http:

        def start(client: str, seed: int) -> asyncio.Task[tuple[int, dict[str, Any]]]:
            return asyncio.create_task(upload(http, gw.url, body(seed), {**FORM, "X-Forwarded-For": client}))

        held = [start("10.0.1.1", 1), start("10.0.1.1", 2)]
        await asyncio.sleep(0.3)
        assert code(await start("10.0.1.1", 3)) == (429, "quota_exceeded")
        other = start("10.0.1.2", 4)  # another client still gets a slot
        await asyncio.sleep(0.3)
        assert not other.done()
        send.set()
        assert [code(a)[0] for a in await asyncio.gather(*held, other)] == [201, 201, 201]


async def test_form_fields_have_their_own_limits_and_codes(base_engine: Engine) -> None:
    good = wav_bytes(clip(1.2, seed=7))
    async with gateway(base_engine) as gw, aiohttp.ClientSession() as http:
        for name in ("n" * 9_000, "n" * 50_000):  # a 9,000-character name was 413 upload_too_large
            status, body = await upload(http, gw.url, voice_form(name, good))
            assert (status, body["error"]["code"]) == (400, "invalid_name")
            assert len(json.dumps(body)) < 300
        assert code(await upload(http, gw.url, voice_form("t", good, "t" * 5_000))) == (
            400,
            "transcript_too_long",
        )
        twice = chunked([part("name", b"Twice"), part("audio", good, "a.wav"), part("audio", good, "b.wav")])
        assert code(await upload(http, gw.url, twice, FORM)) == (400, "duplicate_field")
        fields = chunked([part("name", b"x"), *(part(f"extra{i}", b"e" * 6_000) for i in range(3))])
        assert code(await upload(http, gw.url, fields, FORM)) == (413, "upload_too_large")  # 18 KB of fields
        # a broken boundary line of 50 KB: the message quotes 100 characters of it
        broken = part("name", b"x") + f"--{BOUNDARY}".encode() + b"X" * 50_000 + b"\r\n"
        status, body = await upload(http, gw.url, broken, FORM)
        assert (status, body["error"]["code"]) == (400, "invalid_body") and len(json.dumps(body)) < 400


# --- what a client may keep --------------------------------------------------------------------------
async def test_stored_voices_are_bounded_per_client_and_in_all(base_engine: Engine, tmp_path: Path) -> None:
    """300 voices from one client in 3.6 s were all written to disk and loaded at the next start."""
    limits = ReferenceLimits(max_voices_per_client=2, max_voices=3)
    config = {**PROXIED, "voice_limits": limits, "voices_dir": str(tmp_path)}

    def form(name: str, seed: int) -> aiohttp.FormData:
        return voice_form(name, wav_bytes(clip(1.2, seed=seed)))

    a, b, c = ({"X-Forwarded-For": f"10.0.2.{i}"} for i in (1, 2, 3))
    quota, full = (429, "voice_quota_exceeded"), (507, "voice_store_full")
    async with gateway(base_engine, **config) as gw, aiohttp.ClientSession() as http:
        a1 = await upload(http, gw.url, form("A1", 1), a)
        assert code(await upload(http, gw.url, form("A2", 2), a)) == (201, "ok")
        assert code(await upload(http, gw.url, form("A3", 3), a)) == quota
        assert code(await upload(http, gw.url, form("A1", 1), a)) == (200, "ok")  # found: adds nothing
        assert code(await upload(http, gw.url, form("B1", 4), b)) == (201, "ok")
        assert code(await upload(http, gw.url, form("C1", 5), c)) == full
    owners = sorted(json.loads(p.read_text())["owner"] for p in tmp_path.glob("*.json"))
    assert owners == ["addr:10.0.2.1", "addr:10.0.2.1", "addr:10.0.2.2"]
    async with gateway(base_engine, **config) as gw, aiohttp.ClientSession() as http:  # a restart
        assert code(await upload(http, gw.url, form("A3", 3), a)) == quota
        async with http.delete(f"{gw.url}/v1/audio/voices/{a1[1]['id']}") as r:
            assert r.status == 200
        assert code(await upload(http, gw.url, form("A3", 3), a)) == (201, "ok")


async def test_one_client_keeps_20_voices_by_default(base_engine: Engine) -> None:
    async with gateway(base_engine) as gw, aiohttp.ClientSession() as http:
        for i in range(20):
            assert code(
                await upload(http, gw.url, voice_form(f"V{i}", wav_bytes(clip(1.05, seed=100 + i))))
            ) == (201, "ok")
        refused = await upload(http, gw.url, voice_form("V20", wav_bytes(clip(1.05, seed=120))))
        assert code(refused) == (429, "voice_quota_exceeded")


# --- who may write -----------------------------------------------------------------------------------
async def test_writes_from_another_origins_page_are_refused(base_engine: Engine) -> None:
    """Auth off and no --allow-origin (the defaults): a plain HTML form on any page could post here."""
    short = wav_bytes(clip(0.3))  # refused after the origin check (audio_too_short): no clone needed
    passed = (400, "audio_too_short")
    refused = (403, "origin_not_allowed")
    async with gateway(base_engine, **PROXIED) as gw, aiohttp.ClientSession() as http:
        for origin, want in [
            ("https://evil.example", refused),
            ("null", refused),  # a sandboxed frame or a file:// page
            ("http://127.0.0.1:1", refused),  # this host, another port: another origin
            (gw.url, passed),  # the page this gateway serves: its URL is the Origin
            (None, passed),  # curl, the SDKs
        ]:
            headers = {"Origin": origin} if origin else {}
            assert code(await upload(http, gw.url, voice_form("Page", short), headers)) == want, origin
        evil = {"Origin": "https://evil.example"}
        async with http.delete(f"{gw.url}/v1/audio/voices/nobody", headers=evil) as r:
            assert (r.status, (await r.json())["error"]["code"]) == refused
        async with http.get(f"{gw.url}/v1/audio/voices", headers=evil) as r:
            assert r.status == 200  # reading is not refused (a foreign page cannot read the answer)
        # behind the proxy the page's origin is the forwarded host
        forwarded = {"X-Forwarded-Host": "voice.example", "X-Forwarded-Proto": "https"}
        for origin, want in [("https://voice.example", passed), ("http://voice.example:8080", refused)]:
            headers = {**forwarded, "Origin": origin}
            assert code(await upload(http, gw.url, voice_form("Page", short), headers)) == want, origin
    # an origin the allow-list names may write; the rest may not
    auth = AuthConfig(allowed_origins=("https://app.example",))
    async with gateway(base_engine, auth=auth) as gw, aiohttp.ClientSession() as http:
        listed = await upload(http, gw.url, voice_form("Page", short), {"Origin": "https://app.example"})
        assert code(listed) == passed
        assert code(await upload(http, gw.url, voice_form("Page", short), evil)) == refused


# --- names -------------------------------------------------------------------------------------------
async def test_names_match_in_any_case_and_errors_quote_little(base_engine: Engine) -> None:
    async with gateway(base_engine) as gw, aiohttp.ClientSession() as http:
        upper_id = "VOICE_" + "0" * 24
        assert code(await upload(http, gw.url, voice_form(upper_id, wav_bytes(clip(1.2))))) == (
            400,
            "invalid_name",
        )
        async with http.get(f"{gw.url}/v1/audio/voices/DEFAULT") as r:
            assert r.status == 200 and (await r.json())["id"] == "default"
        async with http.delete(f"{gw.url}/v1/audio/voices/DEFAULT") as r:
            assert (r.status, (await r.json())["error"]["code"]) == (400, "builtin_voice")
        async with http.get(f"{gw.url}/v1/audio/voices/{'k' * 5_000}") as r:
            body = await r.json()
            assert r.status == 404 and len(body["error"]["message"]) < 200
