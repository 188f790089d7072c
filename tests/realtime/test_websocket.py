"""Protocol v1 over a real WebSocket (the `websockets` client) against the real gateway and voice."""

from __future__ import annotations

import asyncio
import json
import time

import av
import numpy as np
import pytest
import websockets

from tests.asr import transcribe, wer
from tests.conftest import TurnResult, read_turn, send_words, wait_engine_idle
from voicewire.engine import Engine

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


async def _connect(base: str):  # type: ignore[no-untyped-def]
    ws = await websockets.connect(f"ws://{base}/v1/stream", max_size=None)
    created = json.loads(await ws.recv())
    assert created["type"] == "session.created" and created["audio"]["sample_rate"] == 24000
    return ws


async def test_three_streamed_turns_are_intelligible_and_really_stream(gateway: str, engine: Engine) -> None:
    ws = await _connect(gateway)
    try:
        results = []
        for i, text in enumerate([*TURNS, LONG_TURN]):
            res = TurnResult(turn_id=f"t{i}")
            reader = asyncio.create_task(read_turn(ws, res))
            await send_words(ws, res.turn_id, text, words_per_s=25, result=res)
            await reader
            results.append((text, res))
        for text, res in results:
            assert res.done is not None and res.done["reason"] == "completed"
            assert next(m["type"] for m in res.messages) == "turn.started"
            hyp = transcribe(res.pcm(), 24_000)
            assert wer(text, hyp) <= 0.15, (text, hyp)
            assert res.done["audio_ms"] == pytest.approx(len(res.audio) / 2 / 24, abs=1)
        long = results[-1][1]
        assert long.audio_times[0] < long.t_last_sent, "first audio must arrive before the last delta is sent"
    finally:
        await ws.close()
    await wait_engine_idle(engine)


async def test_cancel_stops_audio_within_100ms_and_next_turn_works(gateway: str, engine: Engine) -> None:
    ws = await _connect(gateway)
    try:
        res = TurnResult(turn_id="long")
        sender = asyncio.create_task(send_words(ws, "long", LONG_TURN, words_per_s=20))
        while not res.audio:
            msg = await asyncio.wait_for(ws.recv(), 10)
            if isinstance(msg, bytes):
                res.audio += msg
        sender.cancel()
        t_cancel = time.perf_counter()
        await ws.send(json.dumps({"type": "turn.cancel", "turn_id": "long"}))
        await read_turn(ws, res)
        late = [t - t_cancel for t in res.audio_times if t - t_cancel > 0.100]
        assert not late, f"audio arrived {late[0] * 1000:.0f} ms after the cancel"
        assert res.done is not None and res.done["reason"] == "cancelled"
        await wait_engine_idle(engine)
        # text for the cancelled turn is refused; a new turn plays
        await ws.send(json.dumps({"type": "text.delta", "turn_id": "long", "text": "more"}))
        err = json.loads(await ws.recv())
        assert err["type"] == "error" and err["code"] == "turn_ended"
        nxt = TurnResult(turn_id="next")
        reader = asyncio.create_task(read_turn(ws, nxt))
        await send_words(ws, "next", TURNS[2], words_per_s=30)
        await reader
        assert nxt.done is not None and nxt.done["reason"] == "completed"
        assert wer(TURNS[2], transcribe(nxt.pcm(), 24_000)) <= 0.15
    finally:
        await ws.close()
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
        good_turn = TurnResult(turn_id=1)
        good_reader = asyncio.create_task(read_turn(good, good_turn))
        good_sender = asyncio.create_task(send_words(good, 1, TURNS[0], words_per_s=30))
        for raw, code in BAD_INPUTS:
            await bad.send(raw)
            err = json.loads(await asyncio.wait_for(bad.recv(), 5))
            assert err["type"] == "error" and err["code"] == code, (raw, err)
        # text for a turn that already ended
        ended = TurnResult(turn_id="e")
        reader = asyncio.create_task(read_turn(bad, ended))
        await bad.send(json.dumps({"type": "text.delta", "turn_id": "e", "text": "Fine."}))
        await bad.send(json.dumps({"type": "text.end", "turn_id": "e"}))
        await reader
        await bad.send(json.dumps({"type": "text.delta", "turn_id": "e", "text": "late"}))
        err = json.loads(await bad.recv())
        assert err["code"] == "turn_ended" and err["turn_id"] == "e"
        # the bad session is still usable
        again = TurnResult(turn_id="again")
        reader = asyncio.create_task(read_turn(bad, again))
        await send_words(bad, "again", TURNS[1], words_per_s=40)
        await reader
        assert again.done is not None and again.done["reason"] == "completed"
        # over the size limit: closed with 1009, documented
        await bad.send(json.dumps({"type": "text.delta", "turn_id": "big", "text": "x" * 70_000}))
        with pytest.raises(websockets.ConnectionClosed) as closed:
            while True:
                await asyncio.wait_for(bad.recv(), 5)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
        # the other session never noticed
        await good_sender
        await good_reader
        assert good_turn.done is not None and good_turn.done["reason"] == "completed"
        assert wer(TURNS[0], transcribe(good_turn.pcm(), 24_000)) <= 0.15
    finally:
        await bad.close()
        await good.close()
    await wait_engine_idle(engine)


async def test_opus_format_at_48k_decodes_to_intelligible_speech(gateway: str) -> None:
    ws = await _connect(gateway)
    try:
        await ws.send(json.dumps({"type": "session.update", "format": "opus", "sample_rate": 48000}))
        updated = json.loads(await ws.recv())
        assert updated["audio"] == {"format": "opus", "sample_rate": 48000, "channels": 1}
        res = TurnResult(turn_id=1)
        reader = asyncio.create_task(read_turn_packets(ws, res))
        await send_words(ws, 1, TURNS[1], words_per_s=40)
        packets = await reader
        decoder = av.CodecContext.create("opus", "r")
        decoder.sample_rate = 48000
        pcm = []
        for p in packets:
            for frame in decoder.decode(av.Packet(p)):
                pcm.append(frame.to_ndarray().reshape(-1) if frame.format.name != "fltp" else frame.to_ndarray()[0])
                assert frame.samples == 960  # 20 ms at 48 kHz
        audio = np.concatenate(pcm).astype(np.float32)
        if audio.dtype != np.float32 or np.abs(audio).max() > 1.5:
            audio = audio / 32768.0
        assert wer(TURNS[1], transcribe(audio, 48_000)) <= 0.15
    finally:
        await ws.close()


async def read_turn_packets(ws, res: TurnResult) -> list[bytes]:  # type: ignore[no-untyped-def]
    packets: list[bytes] = []
    while True:
        msg = await asyncio.wait_for(ws.recv(), 20)
        if isinstance(msg, bytes):
            packets.append(msg)
        elif json.loads(msg).get("type") == "turn.done":
            return packets
