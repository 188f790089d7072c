"""One voice-name rule for every transport: what ``/v1/audio/speech`` takes, ``session.update``
takes too (names in any case; OpenAI's names and Qwen3-TTS's speakers the model lacks are its
default voice)."""

from __future__ import annotations

import json

import aiohttp
import pytest
import websockets

from tests.conftest import running_gateway
from voicewire.engine import Engine
from voicewire.realtime.voice_names import UnknownVoice, resolve_voice

pytestmark = pytest.mark.shared_cores  # name rules: nothing timed

SPEAKERS = ("ryan", "vivian")  # a CustomVoice checkpoint's own
ACCEPTED = ["", "heart", "HEART", "alloy", "Nova", "Ryan", "uncle_fu"]  # on the embedded voice


def test_the_rule() -> None:
    assert resolve_voice("HEART", ("heart",)) == "heart"
    assert resolve_voice("Alloy", ("heart",)) == ""
    assert resolve_voice("Ryan", ("heart",)) == ""  # a speaker the model lacks: its default
    assert resolve_voice("Ryan", SPEAKERS) == "ryan"  # ...and the speaker on a model that has it
    with pytest.raises(UnknownVoice, match="fenrir"):
        resolve_voice("fenrir", ("heart",))
    with pytest.raises(UnknownVoice) as err:
        resolve_voice("x" * 10_000, ("heart",))
    assert len(str(err.value)) < 250  # the name is echoed cut short


async def test_session_update_and_speech_take_the_same_names(engine: Engine) -> None:
    async with running_gateway(engine) as base, aiohttp.ClientSession() as http:
        for voice in ACCEPTED:
            async with http.post(
                f"http://{base}/v1/audio/speech", json={"input": "Hi.", "voice": voice}
            ) as r:
                assert r.status == 200, (voice, await r.text())
        async with websockets.connect(f"ws://{base}/v1/stream") as ws:
            await ws.recv()  # session.created
            for voice in ACCEPTED:
                await ws.send(json.dumps({"type": "session.update", "voice": voice}))
                reply = json.loads(await ws.recv())
                assert reply["type"] == "session.updated", (voice, reply)
            # the last name given speaks a turn (uncle_fu: the default voice here)
            await ws.send(json.dumps({"type": "text.delta", "turn_id": 1, "text": "Still speaking."}))
            await ws.send(json.dumps({"type": "text.end", "turn_id": 1}))
            while not (isinstance(msg := await ws.recv(), str) and json.loads(msg)["type"] == "turn.done"):
                pass
            assert json.loads(msg)["reason"] == "completed"
            for voice in ("fenrir", "x" * 10_000):
                await ws.send(json.dumps({"type": "session.update", "voice": voice}))
                reply = json.loads(await ws.recv())
                assert (reply["type"], reply["code"]) == ("error", "invalid_voice"), reply
                assert len(reply["message"]) < 250
                async with http.post(
                    f"http://{base}/v1/audio/speech", json={"input": "Hi.", "voice": voice}
                ) as r:
                    error = (await r.json())["error"]
                assert (r.status, error["code"]) == (400, "invalid_voice") and len(error["message"]) < 250
