"""A corpus of text a speech front end reads badly, each sent by an offender while a victim speaks.

Through a real gateway and real clients on 127.0.0.1: the offender sends one pathological
``text.delta`` (or a speech body), the victim starts an ordinary turn right after, and

* the victim's TTFP (its first ``text.delta`` sent -> its first binary audio message) stays under
  500 ms on a 2-core machine;
* the offender's turn ends within 10 s, with audio or an ``error``, never a silent close.

Inputs that are really speech (5,000 digits read in groups: ~50 min of it; 4,000 letters with no
space, read in pieces: minutes) play longer than any test should listen, and take longer to make
than 10 s on a slow 2-core machine: for those the offender must be speaking within 10 s, and a
cancel ends it.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import pytest

from tests.conftest import running_gateway, speak_turn, wait_engine_idle
from voicewire.engine import Engine
from voicewire.realtime.client import Turn, TurnAudio, VoicewireClient

VICTIM_TTFP_LIMIT_S = 0.5
OFFENDER_END_LIMIT_S = 10.0
VICTIM_TEXT = "Sure, I can help you with that booking today."
VICTIM_DELAY_S = 0.05  # the victim starts while the offender's text is in the engine

# name -> (text of one delta, does it end on its own within the limit). Each is under the gateway's
# 8,192 characters per delta and 64 KB per message.
CORPUS: dict[str, tuple[str, bool]] = {
    "emoji_8000": ("😀" * 8000, True),
    "emoji_zwj_sequences": ("👩\u200d👩\u200d👧\u200d👦🏳️\u200d🌈👍🏽" * 600, True),
    "combining_4000": ("a" + "\u0301" * 4000, True),
    "zalgo_words": (" ".join("z" + "\u0336\u0337\u0338\u0489" * 40 for _ in range(50)), True),
    "mixed_scripts": (("日本語Русскийعربي😀ελληνικά한국어עברית" * 160)[:4000], False),  # ~5 min spelled out
    "long_word_no_spaces": ("abcdefghij" * 400, False),  # ~4 min
    "slashes_no_spaces": ("a/" * 2000, False),  # ~2.5 min
    "controls_and_private_use": ("\x00\x1b\x7f\ue000\U000f0000\u202e\ufeff\u200d" * 1000 + "end.", True),
    "symbols_no_spaces": ("&@#%+=<>~^|*" * 300, False),  # every symbol is a word: ~40 min of speech
    "digits_5000": ("7" * 5000, False),
    "arabic_indic_digits": ("٣" * 3000, False),
}


async def _victim_turn(base: str) -> tuple[Turn, TurnAudio]:
    async with await VoicewireClient.connect(f"ws://{base}") as client:
        return await speak_turn(client, VICTIM_TEXT, 25, "victim", timeout_s=20)


def _victim_ttfp_s(victim: tuple[Turn, TurnAudio]) -> float:
    turn, heard = victim
    assert heard.done.reason == "completed", turn.errors
    assert heard.chunks and turn.t_first_text_s is not None, "the victim got no audio"
    return heard.arrival_times_s[0] - turn.t_first_text_s


@pytest.mark.parametrize("name", list(CORPUS))
async def test_an_offending_delta_neither_stalls_others_nor_hangs(engine: Engine, name: str) -> None:
    text, ends = CORPUS[name]
    async with running_gateway(engine) as base:
        offender = await VoicewireClient.connect(f"ws://{base}")
        off_turn = await offender.start_turn("offender")
        t0 = time.perf_counter()
        # The client sends UTF-8 (8,000 emoji: 32 KB), not \u escapes (96 KB, over the message limit).
        await off_turn.send(text)
        await off_turn.end()
        off_reader = asyncio.create_task(off_turn.collect(OFFENDER_END_LIMIT_S))
        await asyncio.sleep(VICTIM_DELAY_S)
        victim = await _victim_turn(base)
        ttfp_s = _victim_ttfp_s(victim)
        assert ttfp_s < VICTIM_TTFP_LIMIT_S, f"{name}: victim TTFP {ttfp_s * 1000:.0f} ms"
        if ends:
            off = await off_reader
            end_s = time.perf_counter() - t0
            assert end_s < OFFENDER_END_LIMIT_S
            if off.done.reason == "error":
                assert any(e.code for e in off_turn.errors)
            else:
                assert off.done.reason == "completed"
        else:
            while off_turn.t_first_audio_s is None and time.perf_counter() - t0 < OFFENDER_END_LIMIT_S:
                await asyncio.sleep(0.05)
            assert off_turn.t_first_audio_s, f"{name}: the offender is not speaking after {OFFENDER_END_LIMIT_S} s"
            assert not off_turn.errors and not offender.errors, (off_turn.errors, offender.errors)
            await off_turn.send_cancel()
            off = await asyncio.wait_for(off_reader, 5)
            assert off.done.reason == "cancelled"
        print(
            f"{name}: victim TTFP {ttfp_s * 1000:.0f} ms, offender {off.done.reason} after "
            f"{(time.perf_counter() - t0):.2f} s with {off.done.audio_ms / 1000:.1f} s of audio"
        )
        await offender.close()
    await wait_engine_idle(engine, timeout_s=5)


async def test_a_speech_body_of_4096_emoji_neither_stalls_others_nor_hangs(engine: Engine) -> None:
    async with running_gateway(engine) as base:
        async with aiohttp.ClientSession() as http:

            async def speech() -> tuple[int, dict[str, Any], float]:
                t0 = time.perf_counter()
                body = {"model": "tts-1", "input": "😀" * 4096, "voice": "heart", "response_format": "wav"}
                async with http.post(f"http://{base}/v1/audio/speech", json=body) as r:
                    data = await r.json()
                    return r.status, data, time.perf_counter() - t0

            offender = asyncio.create_task(speech())
            await asyncio.sleep(VICTIM_DELAY_S)
            victim = await _victim_turn(base)
            status, reply, end_s = await asyncio.wait_for(offender, OFFENDER_END_LIMIT_S)
        ttfp_s = _victim_ttfp_s(victim)
        assert ttfp_s < VICTIM_TTFP_LIMIT_S, f"victim TTFP {ttfp_s * 1000:.0f} ms"
        # Nothing in the input is speakable for an English voice: a clear 400, at once.
        assert (status, reply["error"]["code"]) == (400, "no_speech") and end_s < OFFENDER_END_LIMIT_S
        print(f"speech 4096 emoji: victim TTFP {ttfp_s * 1000:.0f} ms, response after {end_s:.2f} s")
    await wait_engine_idle(engine, timeout_s=5)
