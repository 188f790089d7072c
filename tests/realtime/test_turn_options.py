"""A turn's own controls on its first ``text.delta``: voice, speed (language and instructions for
the models that have them), with the rule of the speech endpoint for voice names."""

from __future__ import annotations

import json

import pytest
import websockets

from voicewire.realtime.client import VoicewireClient, VoicewireError
from voicewire.realtime.protocol import ProtocolError, TextDelta, TurnOptions, parse_client_message

pytestmark = pytest.mark.shared_cores  # audio lengths, not wall time: nothing timed

TEXT = "A turn may choose its own pace."


def test_the_first_delta_parses_the_turns_options() -> None:
    msg = parse_client_message(
        json.dumps({"type": "text.delta", "turn_id": 1, "text": "Hi", "voice": "alloy", "speed": 1.5, "language": "English"})
    )
    assert msg == TextDelta(1, "Hi", TurnOptions(voice="alloy", speed=1.5, language="English"))
    assert parse_client_message('{"type":"text.delta","turn_id":1,"text":"Hi"}') == TextDelta(1, "Hi")
    for bad in ({"speed": 3}, {"speed": True}, {"voice": 7}, {"instructions": "x" * 1001}):
        with pytest.raises(ProtocolError) as err:
            parse_client_message(json.dumps({"type": "text.delta", "turn_id": 1, "text": "Hi", **bad}))
        assert err.value.code == "invalid_field", bad


async def _audio_ms(client: VoicewireClient, **options: object) -> float:
    turn = client.speak([TEXT], **options)
    async for _ in turn.audio():
        pass
    done = await turn.done(timeout_s=20)
    assert done.reason == "completed"
    return done.audio_ms


async def test_a_turn_speaks_at_its_own_speed_and_voice_and_the_session_keeps_its_own(gateway: str) -> None:
    async with await VoicewireClient.connect(f"ws://{gateway}") as client:
        normal = await _audio_ms(client)
        fast = await _audio_ms(client, speed=2.0)
        assert fast < 0.75 * normal, (fast, normal)
        assert await _audio_ms(client) == pytest.approx(normal, rel=0.1)  # the next turn: the session's pace
        # voice names as on /v1/audio/speech: an OpenAI name is the default voice, any case matches
        assert await _audio_ms(client, voice="alloy") == pytest.approx(normal, rel=0.1)
        assert await _audio_ms(client, voice="HEART") == pytest.approx(normal, rel=0.1)
        refused = client.speak([TEXT], voice="nobody")
        with pytest.raises(VoicewireError) as err:
            await refused.done(timeout_s=10)
        assert err.value.code == "invalid_voice"
        assert await _audio_ms(client) == pytest.approx(normal, rel=0.1)  # the session goes on


async def test_options_on_a_later_delta_change_nothing(gateway: str) -> None:
    async with websockets.connect(f"ws://{gateway}/v1/stream") as ws:
        await ws.recv()
        await ws.send(json.dumps({"type": "text.delta", "turn_id": 1, "text": TEXT + " "}))
        await ws.send(json.dumps({"type": "text.delta", "turn_id": 1, "text": "Still.", "speed": 2.0, "voice": "x"}))
        await ws.send(json.dumps({"type": "text.end", "turn_id": 1}))
        while True:
            msg = await ws.recv()
            if isinstance(msg, str):
                body = json.loads(msg)
                assert body["type"] != "error", body
                if body["type"] == "turn.done":
                    assert body["reason"] == "completed"
                    break
