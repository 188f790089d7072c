"""Word timings (``turn.words``) and playback-true truncation, end to end: the real gateway and voice,
the protocol-v1 WebSocket client, the aiortc peer, and Whisper for what the audio says."""

from __future__ import annotations

import itertools
import json
from typing import Any

import av
import numpy as np
import websockets

from tests.conftest import running_gateway
from tests.realtime.test_client import LONG_REPLY, _check_prefix, fake_chat_completion
from voicewire.engine import Engine
from voicewire.realtime.client import ReceivedAudio, Turn, TurnWords, VoicewireClient, WordTiming
from voicewire.realtime.client.webrtc import SAMPLE_RATE_HZ, SOUND_DBFS, WebRtcClient
from voicewire.realtime.protocol import ProtocolError, TurnCancel, parse_client_message

CUT_MS = 1500.0


def _check_words(words: list[WordTiming], text: str) -> None:
    """In order, each once, inside the audio's time line, and each word's characters in the text."""
    assert words
    for a, b in itertools.pairwise(words):
        assert a.start_ms <= a.end_ms <= b.start_ms + 1e-6 and a.char_end <= b.char_start
    for w in words:
        assert 0 <= w.char_start <= w.char_end <= len(text)
        letters = [c.lower() for c in w.word if c.isalnum()]
        assert [c.lower() for c in text[w.char_start : w.char_end] if c.isalnum()] == letters, w


def _spoken_at(words: list[WordTiming], text: str, played_ms: float) -> str:
    """The prefix of ``text`` whose words' first halves lie within ``played_ms``."""
    kept = [w for w in words if (w.start_ms + w.end_ms) / 2 <= played_ms]
    return text[: kept[-1].char_end].strip() if kept else ""


def _opus_pcm(packets: list[ReceivedAudio]) -> np.ndarray:
    decoder = av.CodecContext.create("opus", "r")
    decoder.sample_rate = 48_000  # type: ignore[attr-defined]
    out = []
    for p in packets:
        for frame in decoder.decode(av.Packet(p.data)):  # type: ignore[attr-defined]
            arr = frame.to_ndarray()
            out.append(arr[0] if frame.format.name == "fltp" else arr.reshape(-1) / 32768.0)
    return np.concatenate(out).astype(np.float32)


async def test_websocket_words_come_before_their_audio_and_a_cancel_reports_what_was_consumed(
    engine: Engine,
) -> None:
    async with running_gateway(engine) as base:
        # Opus: one 20 ms packet per message, so the reader's consumption grows in 20 ms steps.
        client = await VoicewireClient.connect(f"http://{base}", format="opus", sample_rate_hz=48_000)
        turn = client.speak(fake_chat_completion(LONG_REPLY, tokens_per_s=40))
        packets: list[ReceivedAudio] = []
        async for event in turn.events():
            if isinstance(event, TurnWords):
                # every word of the message starts in audio not received yet
                assert all(w.start_ms >= turn.consumed_ms - 1e-6 for w in event.words), event
            else:
                packets.append(event)
                if turn.consumed_ms >= CUT_MS:
                    break
        done = await turn.cancel()  # played_ms: what this reader consumed
        words = turn.words()
        await client.close()
    assert done.reason == "cancelled" and done.played_source == "client"
    assert abs(done.played_ms - CUT_MS) <= 100, done.played_ms
    assert done.played_ms < done.audio_ms
    _check_words(words, LONG_REPLY)
    assert done.text_spoken == _spoken_at(words, LONG_REPLY, done.played_ms)
    _check_prefix(done.text_spoken, LONG_REPLY, _opus_pcm(packets), 48_000)  # what the consumed audio says


async def test_webrtc_words_come_on_the_channel_before_their_audio_and_a_cancel_reports_the_paced_audio(
    engine: Engine,
) -> None:
    async with running_gateway(engine) as base:
        client = await WebRtcClient.connect(f"http://{base}")
        turn = client.speak(fake_chat_completion(LONG_REPLY, tokens_per_s=40))
        frames: list[ReceivedAudio] = []
        sound_ms = 0.0  # the turn's frames with sound out of aiortc's receiver (silence around a turn)
        async for event in turn.events():
            if isinstance(event, TurnWords):
                # every word of the message starts in audio that has not come out of the receiver yet
                assert all(w.start_ms >= sound_ms - 20 for w in event.words), (event, sound_ms)
                continue
            frames.append(event)
            if sound_ms or np.any(event.pcm()):
                sound_ms += event.duration_s * 1000
            if _arrived_sound_ms(client, turn) >= CUT_MS:
                break
        done = await turn.cancel()
        words = turn.words()
        await client.close()
    assert done.reason == "cancelled" and done.played_source == "paced"
    # The listener cut when 1.5 s of the turn's sound had arrived; the server counts what its pacer
    # sent. (aiortc's jitter buffer then holds 80 ms more before playing: the client's own delay.)
    assert abs(done.played_ms - CUT_MS) <= 100, done.played_ms
    assert 0 <= CUT_MS - sound_ms <= 200, sound_ms
    _check_words(words, LONG_REPLY)
    assert done.text_spoken == _spoken_at(words, LONG_REPLY, done.played_ms)
    pcm = np.concatenate([f.pcm() for f in frames if np.any(f.pcm())]).astype(np.float32) / 32768.0
    _check_prefix(done.text_spoken, LONG_REPLY, pcm, SAMPLE_RATE_HZ)


def _arrived_sound_ms(client: WebRtcClient, turn: Turn) -> float:
    """RTP audio of the turn that has arrived, from its first packet with sound (ms)."""
    packets = client.turn_packets(turn, tail_s=0.0)
    first = next((i for i, p in enumerate(packets) if p.level_dbfs > SOUND_DBFS), None)
    return 0.0 if first is None else sum(p.samples for p in packets[first:]) * 1000 / SAMPLE_RATE_HZ


async def test_a_client_that_ignores_unknown_messages_still_gets_its_turn(engine: Engine) -> None:
    known = {"session.created", "session.updated", "turn.started", "turn.done", "error"}
    text = "Hello there. This is an old client."
    async with running_gateway(engine) as base, websockets.connect(f"ws://{base}/v1/stream") as ws:
        await ws.send(json.dumps({"type": "text.delta", "turn_id": 1, "text": text}))
        await ws.send(json.dumps({"type": "text.end", "turn_id": 1}))
        audio, seen, done = 0, [], None
        async for raw in ws:
            if isinstance(raw, bytes):
                audio += len(raw)
                continue
            msg: dict[str, Any] = json.loads(raw)
            seen.append(msg["type"])
            if msg["type"] not in known:
                continue  # what an old client does with turn.words
            if msg["type"] == "turn.done":
                done = msg
                break
    assert "turn.words" in seen and done is not None and done["reason"] == "completed"
    assert audio / 2 / 24 == done["audio_ms"] or abs(audio / 2 / 24 - done["audio_ms"]) < 1
    assert done["played_source"] == "sent" and done["text_spoken"]


def test_turn_cancel_takes_an_optional_played_ms() -> None:
    assert parse_client_message('{"type":"turn.cancel","turn_id":1}') == TurnCancel(1)
    assert parse_client_message('{"type":"turn.cancel","turn_id":1,"played_ms":1500}') == TurnCancel(1, 1500.0)
    for bad in ('"1500"', "-1", "true", "1e400", "NaN"):
        try:
            parse_client_message(f'{{"type":"turn.cancel","turn_id":1,"played_ms":{bad}}}')
        except ProtocolError as err:
            assert err.code == "invalid_field" and err.turn_id == 1
        else:
            raise AssertionError(f"played_ms {bad} was taken")


async def test_a_reported_position_is_capped_at_the_audio_sent_and_a_bad_one_refused(engine: Engine) -> None:
    async with running_gateway(engine) as base:
        client = await VoicewireClient.connect(f"http://{base}")
        turn = client.speak(fake_chat_completion(LONG_REPLY, tokens_per_s=40))
        async for event in turn.events():
            if isinstance(event, ReceivedAudio):
                break  # some audio has come: the turn is open and speaking
        refused = client.expect("error")
        await client.send_message({"type": "turn.cancel", "turn_id": turn.turn_id, "played_ms": "1500"})
        error = await refused
        assert error["code"] == "invalid_field" and error["turn_id"] == turn.turn_id
        done = await turn.cancel(played_ms=3_600_000.0)  # an hour: more than the server sent
        await client.close()
    assert done.reason == "cancelled" and done.played_source == "client"
    assert done.played_ms == done.audio_ms > 0  # capped at what was sent
