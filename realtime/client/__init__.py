"""The client side of voicewire: a Python client of protocol v1 (asyncio), an aiortc peer, the
agent-framework adapters (``adapters.pipecat``, ``adapters.livekit``) and the load generator
(``probe``). The gateway imports none of it.

    client = await VoicewireClient.connect("ws://127.0.0.1:8080/v1/stream")
    turn = await client.start_turn()
    await turn.send("Sure, I can ")
    await turn.send("help with that.")
    await turn.end()
    async for chunk in turn.audio():        # ReceivedAudio: 24 kHz PCM16 mono by default
        player.write(chunk.data)
    done = await turn.done()                # TurnDone: reason, audio_ms, played_ms, text_spoken, metrics

    # One call: speak a streaming chat completion (str deltas or OpenAI-style chunks).
    async for chunk in client.speak(await openai.chat.completions.create(..., stream=True)):
        player.write(chunk.data)

Word timings: ``turn.events()`` yields the audio and ``TurnWords`` (each before its audio);
``turn.words()`` lists those received so far (``WordTiming``: word, start_ms, end_ms, and
char_start/char_end in the text sent).

Barge-in: ``done = await turn.cancel()`` reports the audio the caller took from ``audio()`` as
played (``played_ms=`` to give another position); ``done.text_spoken`` is the text of the words
up to ``done.played_ms``, to truncate the agent's context with.

Over WebRTC: ``voicewire.realtime.client.webrtc.WebRtcClient`` offers the same turns (it imports
aiortc, so it is not imported here).
"""

from .messages import (
    DEFAULT_SAMPLE_RATE_HZ,
    ReceivedAudio,
    TurnAudio,
    TurnDone,
    TurnEvent,
    TurnId,
    TurnWords,
    VoicewireError,
    WordTiming,
    delta_text,
)
from .protocol import ProtocolClient, Turn
from .websocket import VoicewireClient, speak, stream_url

__all__ = [
    "DEFAULT_SAMPLE_RATE_HZ",
    "ProtocolClient",
    "ReceivedAudio",
    "Turn",
    "TurnAudio",
    "TurnDone",
    "TurnEvent",
    "TurnId",
    "TurnWords",
    "VoicewireClient",
    "VoicewireError",
    "WordTiming",
    "delta_text",
    "speak",
    "stream_url",
]
