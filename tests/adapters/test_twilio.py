"""The Twilio Media Streams adapter against a real gateway and engine, Twilio played by a fake that
records the events it is sent and echoes marks as a call that played them would."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import numpy as np

from tests.asr import transcribe, wer
from tests.realtime.test_telephony import g711_decode
from voicewire.realtime.client.adapters.twilio import MARK_EVERY_MS, TwilioSpeaker

REPLY = (
    "Thanks for calling, I can help with that. Your order shipped this morning and should arrive by Thursday."
)
SID = "MZ0123456789abcdef0123456789abcdef"


class FakeTwilio:
    """Twilio's side of the call's WebSocket: records events; echoes the marks up to ``heard_ms``."""

    def __init__(self, heard_ms: float = float("inf")) -> None:
        self.events: list[dict[str, Any]] = []
        self.heard_ms = heard_ms
        self.speaker: TwilioSpeaker | None = None

    async def send(self, raw: str) -> None:
        event = json.loads(raw)
        self.events.append(event)
        heard = event["event"] == "mark" and float(event["mark"]["name"].rpartition(":")[2]) <= self.heard_ms
        if heard and self.speaker is not None:
            self.speaker.receive(json.dumps({"event": "mark", "streamSid": SID, "mark": event["mark"]}))

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == kind]


async def _speaker(gateway: str, twilio: FakeTwilio) -> TwilioSpeaker:
    speaker = await TwilioSpeaker.connect(f"ws://{gateway}", twilio.send)
    twilio.speaker = speaker
    speaker.receive(json.dumps({"event": "start", "streamSid": SID, "start": {"streamSid": SID}}))
    return speaker


async def test_a_reply_goes_out_as_twilio_media_and_is_intelligible(gateway: str) -> None:
    twilio = FakeTwilio()
    speaker = await _speaker(gateway, twilio)
    try:
        done = await speaker.say(w + " " for w in REPLY.split())
    finally:
        await speaker.close()
    assert done.reason == "completed"
    assert {e["streamSid"] for e in twilio.events} == {SID}
    payloads = [base64.b64decode(e["media"]["payload"]) for e in twilio.of("media")]
    assert {len(p) for p in payloads} == {160}  # 20 ms of 8 kHz mu-law each
    assert twilio.events[-1]["event"] == "mark"  # the end of the reply is marked
    assert len(twilio.of("mark")) >= len(payloads) * 20 / MARK_EVERY_MS
    pcm = g711_decode(b"".join(payloads), "mulaw").astype(np.float32) / 32768.0
    hyp = transcribe(pcm, 8_000)
    assert wer(REPLY, hyp) <= 0.15, hyp


async def test_an_interruption_clears_twilio_and_cuts_the_text_at_the_last_mark_heard(gateway: str) -> None:
    twilio = FakeTwilio(heard_ms=1_000)
    speaker = await _speaker(gateway, twilio)
    try:
        await speaker.say([REPLY])
        done = await speaker.interrupt()
    finally:
        await speaker.close()
    assert done is not None and twilio.events[-1]["event"] == "clear"
    assert done.played_ms == 1_000 and done.played_source == "client"
    assert done.text_spoken and REPLY.startswith(done.text_spoken) and len(done.text_spoken) < len(REPLY) / 2


async def test_nothing_of_an_interrupted_reply_follows_the_clear(gateway: str) -> None:
    twilio = FakeTwilio(heard_ms=200)
    speaker = await _speaker(gateway, twilio)

    async def words() -> AsyncIterator[str]:
        for w in (REPLY + " " + REPLY).split():
            yield w + " "
            await asyncio.sleep(0.05)  # an LLM at 20 words/s: the reply is still being written

    try:
        reply = asyncio.create_task(speaker.say(words()))
        while len(twilio.of("media")) < 20:
            await asyncio.sleep(0.01)
        done = await speaker.interrupt()
        assert (await reply).reason == "cancelled"
    finally:
        await speaker.close()
    assert done is not None and done.reason == "cancelled" and done.played_ms == 200
    kinds = [e["event"] for e in twilio.events]
    assert "media" not in kinds[kinds.index("clear") :]
