"""voicewire as the voice of a Twilio phone call (Media Streams, bidirectional ``<Connect><Stream>``).

    speaker = await TwilioSpeaker.connect("http://127.0.0.1:8080", twilio_ws.send_str)
    async for msg in twilio_ws:              # Twilio's JSON events, in order
        speaker.receive(msg.data)            # "start" gives the streamSid; "mark" the playback
        ...                                  # "media" (the caller) to your ASR; with a reply:
        reply = asyncio.create_task(speaker.say(llm_stream))   # TurnDone once all of it is sent
        ...                                  # the caller talks over it:
        done = await speaker.interrupt()     # Twilio drops what it queued; done.text_spoken

The voicewire session speaks G.711 mu-law at 8000 Hz (``format: "mulaw"``), so its 20 ms binary
messages are Twilio ``media`` payloads as they are (160 bytes, base64): no resampling or
transcoding here. Twilio plays what it is sent in order and echoes each ``mark`` when playback
reaches it; a mark every ``MARK_EVERY_MS`` tells how much of the reply the caller heard, which
``interrupt`` reports as ``played_ms`` (the server cuts ``text_spoken`` there, for the agent's
context). No Twilio package is needed: the events are Twilio's documented JSON.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterable, Awaitable, Callable, Iterable
from typing import Any

from ..messages import TurnDone
from ..protocol import Turn
from ..websocket import VoicewireClient

FRAME_MS = 20.0  # one mu-law message from the server
MARK_EVERY_MS = 200.0  # playback resolution of an interruption; a mark is ~80 bytes of JSON

SendText = Callable[[str], Awaitable[Any]]


class TwilioSpeaker:
    """One call: voicewire turns in, Twilio ``media`` / ``mark`` / ``clear`` events out."""

    def __init__(self, client: VoicewireClient, send: SendText) -> None:
        self.client = client
        self.stream_sid: str | None = None  # from Twilio's "start" event
        self._send = send
        self._turn: Turn | None = None
        self._sent_ms = 0.0  # audio of the current turn sent to Twilio
        self._played_ms = 0.0  # up to the last mark Twilio echoed back
        self._interrupted: Turn | None = None  # sends nothing more of this turn after "clear"

    @classmethod
    async def connect(cls, url: str, send: SendText, **options: Any) -> TwilioSpeaker:
        """``url``: the voicewire server; ``send``: writes one text message to Twilio's WebSocket."""
        client = await VoicewireClient.connect(url, format="mulaw", sample_rate_hz=8_000, **options)
        return cls(client, send)

    def receive(self, raw: str) -> None:
        """One event from Twilio: "start" names the stream, "mark" moves the playback position;
        "media" (the caller's audio, for your speech recognizer), "connected" and "stop" are the
        caller's business."""
        event = json.loads(raw)
        kind = event.get("event")
        if kind == "start":
            self.stream_sid = event.get("streamSid") or event.get("start", {}).get("streamSid")
        elif kind == "mark" and self._turn is not None:
            name = str(event.get("mark", {}).get("name", ""))
            turn_id, _, ms = name.rpartition(":")
            if turn_id == str(self._turn.turn_id):
                self._played_ms = max(self._played_ms, float(ms))

    async def say(self, deltas: AsyncIterable[Any] | Iterable[Any]) -> TurnDone:
        """Speak an LLM's stream into the call; returns once all its audio went to Twilio (the
        caller hears it over the following seconds)."""
        if self.stream_sid is None:
            raise RuntimeError("no streamSid yet: pass Twilio's start event to receive() first")
        turn = self.client.speak(deltas)
        self._turn, self._sent_ms, self._played_ms = turn, 0.0, 0.0
        next_mark_ms = MARK_EVERY_MS
        async for audio in turn.audio():
            if self._interrupted is turn:
                break
            payload = base64.b64encode(audio.data).decode()
            await self._event({"event": "media", "media": {"payload": payload}})
            self._sent_ms += FRAME_MS
            if self._sent_ms >= next_mark_ms:
                await self._mark(turn)
                next_mark_ms += MARK_EVERY_MS
        if self._interrupted is not turn:
            await self._mark(turn)
        return await turn.done()

    async def interrupt(self) -> TurnDone | None:
        """Barge-in: Twilio drops the audio it queued ("clear"), the server stops the turn and cuts
        its ``text_spoken`` at the last mark played. None when nothing was said."""
        turn = self._turn
        if turn is None:
            return None
        self._interrupted = turn
        await self._event({"event": "clear"})
        return await turn.cancel(played_ms=self._played_ms)

    async def close(self) -> None:
        await self.client.close()

    async def _mark(self, turn: Turn) -> None:
        await self._event({"event": "mark", "mark": {"name": f"{turn.turn_id}:{self._sent_ms:.0f}"}})

    async def _event(self, msg: dict[str, Any]) -> None:
        await self._send(json.dumps({**msg, "streamSid": self.stream_sid}, separators=(",", ":")))
