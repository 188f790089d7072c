"""Phone-call audio on the WebSocket: ``session.update`` with G.711 (mulaw / alaw) at 8000 Hz gives
20 ms binary messages of 160 bytes that FFmpeg's G.711 decoders read back as intelligible speech."""

from __future__ import annotations

import asyncio
import io

import av
import numpy as np
import pytest

from tests.asr import transcribe, wer
from tests.conftest import speak_turn
from tests.realtime.test_websocket import TURNS
from voicewire.realtime.client import VoicewireClient
from voicewire.realtime.protocol import ProtocolError, SessionUpdate, parse_client_message
from voicewire.realtime.telephony import G711Codec

RATE_HZ = 8_000
FRAME_BYTES = 160  # 20 ms at 8000 Hz, a byte a sample


def g711_decode(data: bytes, law: str) -> np.ndarray:
    with av.open(io.BytesIO(data), format=law, options={"sample_rate": str(RATE_HZ)}) as container:
        return np.concatenate([f.to_ndarray().reshape(-1) for f in container.decode(audio=0)])


@pytest.mark.parametrize("law", ["mulaw", "alaw"])
async def test_a_g711_turn_is_20ms_frames_and_intelligible(gateway: str, law: str) -> None:
    async with await VoicewireClient.connect(f"ws://{gateway}", format=law, sample_rate_hz=RATE_HZ) as client:
        assert (client.audio_format, client.sample_rate_hz) == (law, RATE_HZ)
        heard = [(text, (await speak_turn(client, text, 25))[1]) for text in TURNS]
    for text, turn in heard:
        assert turn.done.reason == "completed"
        assert {len(c.data) for c in turn.chunks} == {FRAME_BYTES}
        pcm = g711_decode(turn.data, law).astype(np.float32) / 32768.0
        assert pcm.size == len(turn.data)
        hyp = transcribe(pcm, RATE_HZ)
        assert wer(text, hyp) <= 0.15, (text, hyp)


async def test_other_apis_names_select_g711_and_imply_8000_hz(gateway: str) -> None:
    async with await VoicewireClient.connect(f"ws://{gateway}") as client:
        reply = client.expect("session.updated")
        await client.send_raw('{"type":"session.update","format":"ulaw_8000"}')
        updated = await asyncio.wait_for(reply, 5)
        assert updated["audio"] == {"format": "mulaw", "sample_rate": RATE_HZ, "channels": 1}
        refused = client.expect("error")
        await client.send_raw('{"type":"session.update","format":"alaw","sample_rate":24000}')
        assert (await asyncio.wait_for(refused, 5))["code"] == "invalid_field"


def test_session_update_formats_and_rates() -> None:
    def update(body: str) -> SessionUpdate:
        msg = parse_client_message('{"type":"session.update",' + body + "}")
        assert isinstance(msg, SessionUpdate)
        return msg

    assert update('"format":"mulaw"') == SessionUpdate("mulaw", RATE_HZ)
    assert update('"format":"pcm_alaw","sample_rate":8000') == SessionUpdate("alaw", RATE_HZ)
    assert update('"format":"pcm16","sample_rate":8000') == SessionUpdate("pcm16", RATE_HZ)
    for bad in ('"format":"mulaw","sample_rate":24000', '"sample_rate":16000', '"format":"g729"'):
        with pytest.raises(ProtocolError) as err:
            update(bad)
        assert err.value.code == "invalid_field"


def test_g711_bytes_are_ffmpegs_and_round_trip() -> None:
    every = np.arange(-32768, 32768, 7, dtype="<i2")
    for law, max_error in (("mulaw", 1024), ("alaw", 1024)):
        back = g711_decode(G711Codec(law).encode(every), law)
        # G.711's steps grow with the level: 8 bits for 14 (mu-law) or 13 (A-law) of range.
        assert np.abs(back.astype(np.int32) - every).max() <= max_error
        small = np.abs(every.astype(np.int32)) < 256
        assert np.abs(back[small].astype(np.int32) - every[small]).max() <= 16


def test_the_client_counts_g711_audio_a_byte_a_sample() -> None:
    from voicewire.realtime.client.messages import ReceivedAudio

    for fmt in ("mulaw", "alaw"):
        assert ReceivedAudio(b"\0" * 160, fmt, 8000, 0.0).duration_s == 0.02  # what turn.cancel reports
    assert ReceivedAudio(b"\0" * 320, "pcm16", 8000, 0.0).duration_s == 0.02
