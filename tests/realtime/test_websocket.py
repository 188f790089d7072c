"""Protocol v1 over a real WebSocket (the protocol-v1 client) against the real gateway and voice."""

from __future__ import annotations

import asyncio
import gc
import time
from typing import Any

import av
import numpy as np
import pytest

from tests.asr import transcribe, wer
from tests.conftest import speak_turn, wait_engine_idle
from voicewire.engine import Engine
from voicewire.realtime.client import VoicewireClient
from voicewire.realtime.client.simulated_llm import send_reply

TURNS = [
    "Hello, thanks for calling. How can I help you today?",
    "Your order number is 4521, and it will arrive on Friday.",
    "Is there anything else I can do for you before we finish?",
]
LONG_TURN = (
    "Let me walk you through the whole process step by step, so nothing is missed. "
    "First, open the settings page and find the section called account details. "
    "Then choose the option to update your address, and save the changes when you are done."
)


async def _connect(base: str, **options: Any) -> VoicewireClient:
    client = await VoicewireClient.connect(f"ws://{base}", **options)
    assert client.session["type"] == "session.created" and client.session["audio"]["sample_rate"] == 24000
    return client


async def test_three_streamed_turns_are_intelligible_and_really_stream(gateway: str, engine: Engine) -> None:
    async with await _connect(gateway) as client:
        results = [(text, *await speak_turn(client, text, 25)) for text in [*TURNS, LONG_TURN]]
    for text, turn, heard in results:
        assert heard.done.reason == "completed"
        assert turn.started and heard.chunks  # audio came between turn.started and turn.done
        hyp = transcribe(heard.pcm(), 24_000)
        assert wer(text, hyp) <= 0.15, (text, hyp)
        assert heard.done.audio_ms == pytest.approx(len(heard.data) / 2 / 24, abs=1)
    _, long_turn, long = results[-1]
    assert long_turn.t_last_text_s is not None
    assert long.arrival_times_s[0] < long_turn.t_last_text_s, "first audio must arrive before the last delta is sent"
    await wait_engine_idle(engine)


async def test_cancel_stops_audio_within_100ms_and_next_turn_works(gateway: str, engine: Engine) -> None:
    async with await _connect(gateway) as client:
        turn = await client.start_turn("long")
        sender = asyncio.create_task(send_reply(turn, LONG_TURN, 20))
        audio = turn.audio()
        await anext(audio)
        sender.cancel()
        t_cancel = time.perf_counter()
        await turn.send_cancel()
        late = [c.t_received_s - t_cancel async for c in audio if c.t_received_s - t_cancel > 0.100]
        assert not late, f"audio arrived {late[0] * 1000:.0f} ms after the cancel"
        assert (await turn.done(10)).reason == "cancelled"
        await wait_engine_idle(engine)
        # text for the cancelled turn is refused; a new turn plays
        refused = client.expect("error")
        await client.send_message({"type": "text.delta", "turn_id": "long", "text": "more"})
        assert (await asyncio.wait_for(refused, 5))["code"] == "turn_ended"
        _, nxt = await speak_turn(client, TURNS[2], 30, "next")
        assert nxt.done.reason == "completed"
        assert wer(TURNS[2], transcribe(nxt.pcm(), 24_000)) <= 0.15
    await wait_engine_idle(engine)


BAD_INPUTS = [
    ("{not json", "invalid_json"),
    ('{"type":"speak","text":"x"}', "unknown_type"),
    ('{"type":"text.delta","text":"no turn id"}', "missing_field"),
    ('{"type":"text.delta","turn_id":9,"text":42}', "invalid_field"),
    ('{"type":"text.flush","turn_id":"never-seen"}', "unknown_turn"),
    (b"\x01\x02binary", "binary_not_supported"),
]


async def test_bad_inputs_get_error_codes_and_leave_sessions_usable(gateway: str, engine: Engine) -> None:
    bad = await _connect(gateway)
    good = await _connect(gateway)
    try:
        good_turn = asyncio.create_task(speak_turn(good, TURNS[0], 30, 1))
        for raw, code in BAD_INPUTS:
            answer = bad.expect("error")
            await bad.send_raw(raw)
            err = await asyncio.wait_for(answer, 5)
            assert err["code"] == code, (raw, err)
        # text for a turn that already ended
        await speak_turn(bad, "Fine.", None, "e")
        answer = bad.expect("error")
        await bad.send_message({"type": "text.delta", "turn_id": "e", "text": "late"})
        err = await asyncio.wait_for(answer, 5)
        assert err["code"] == "turn_ended" and err["turn_id"] == "e"
        # the bad session is still usable
        _, again = await speak_turn(bad, TURNS[1], 40, "again")
        assert again.done.reason == "completed"
        # over the size limit: closed with 1009, documented
        await bad.send_message({"type": "text.delta", "turn_id": "big", "text": "x" * 70_000})
        await bad.wait_closed(5)
        assert bad.close_code == 1009
        # the other session never noticed
        _, heard = await good_turn
        assert heard.done.reason == "completed"
        assert wer(TURNS[0], transcribe(heard.pcm(), 24_000)) <= 0.15
    finally:
        await bad.close()
        await good.close()
    await wait_engine_idle(engine)


async def test_opus_format_at_48k_decodes_to_intelligible_speech(gateway: str) -> None:
    async with await _connect(gateway) as client:
        answer = client.expect("session.updated")
        await client.send_message({"type": "session.update", "format": "opus", "sample_rate": 48000})
        updated = await asyncio.wait_for(answer, 5)
        assert updated["audio"] == {"format": "opus", "sample_rate": 48000, "channels": 1}
        _, heard = await speak_turn(client, TURNS[1], 40, 1)
    assert heard.chunks and all(c.format == "opus" for c in heard.chunks)
    decoder = av.CodecContext.create("opus", "r")
    decoder.sample_rate = 48000
    pcm = []
    for c in heard.chunks:
        for frame in decoder.decode(av.Packet(c.data)):
            pcm.append(frame.to_ndarray().reshape(-1) if frame.format.name != "fltp" else frame.to_ndarray()[0])
            assert frame.samples == 960  # 20 ms at 48 kHz
    audio = np.concatenate(pcm).astype(np.float32)
    if audio.dtype != np.float32 or np.abs(audio).max() > 1.5:
        audio = audio / 32768.0
    assert wer(TURNS[1], transcribe(audio, 48_000)) <= 0.15


def _first_words(n: int, text: str) -> list[str]:
    return [w.strip(".,?!").lower() for w in text.split()][:n]


def _check_heard(text_spoken: str, full: str, pcm: np.ndarray, played_ms: float) -> None:
    """``text_spoken`` starts the reply and holds the words Whisper hears in its first ``played_ms``."""
    heard = transcribe(pcm[: round(played_ms * 24)], 24_000)
    assert text_spoken and full.startswith(text_spoken), (text_spoken, heard)
    assert abs(len(text_spoken.split()) - len(heard.split())) <= 1, (text_spoken, heard)
    n = min(len(text_spoken.split()), len(heard.split()))
    assert wer(" ".join(_first_words(n, text_spoken)), " ".join(_first_words(n, heard))) <= 0.34, (text_spoken, heard)


async def test_a_cancel_after_turn_done_truncates_at_the_position_played(gateway: str, engine: Engine) -> None:
    """The WebSocket sends a reply long before it plays: a listener who barges in after a second
    of it gets the words of that second, not the whole reply."""
    async with await _connect(gateway) as client:
        _, heard = await speak_turn(client, LONG_TURN, None, "long")
        assert heard.done.reason == "completed" and heard.done.audio_ms > 5000
        answer = client.expect("turn.truncated")
        await client.send_message({"type": "turn.cancel", "turn_id": "long", "played_ms": 1000})
        truncated = await asyncio.wait_for(answer, 5)
        # A later turn plays as before, and the truncated turn's position can be given again.
        _, nxt = await speak_turn(client, TURNS[0], None, "next")
        again = client.expect("turn.truncated")
        await client.send_message({"type": "turn.cancel", "turn_id": "long", "played_ms": 10**6})
        whole = await asyncio.wait_for(again, 5)
    assert truncated["turn_id"] == "long" and truncated["played_source"] == "client"
    assert truncated["played_ms"] == 1000.0 and truncated["audio_ms"] == heard.done.audio_ms
    _check_heard(truncated["text_spoken"], LONG_TURN, heard.pcm(), 1000)
    assert nxt.done.reason == "completed"
    assert whole["played_ms"] == heard.done.audio_ms  # capped at the audio sent
    assert whole["text_spoken"] == LONG_TURN
    await wait_engine_idle(engine)


async def test_closed_sessions_leave_no_connection_for_the_collector(gateway: str, engine: Engine) -> None:
    """A closed session's connection (aiohttp's protocol, request and WebSocketResponse) goes when its
    last reference does, not at the next full collection, which in a loaded gateway walks it first."""
    gc.collect()
    for text in TURNS:
        async with await _connect(gateway) as client:
            _, heard = await speak_turn(client, text, None)
            assert heard.done.reason == "completed"
    await wait_engine_idle(engine)
    await asyncio.sleep(0.2)  # the server's side of the last close
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        left = [type(o).__qualname__ for o in gc.garbage if type(o).__module__.startswith("aiohttp.web")]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert not left, f"closed sessions' objects freed only by the collector: {sorted(set(left))}"
