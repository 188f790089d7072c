"""Word timings of Qwen3-TTS (tiny random weights: format and coverage, not accuracy) through the
real gateway and WebSocket client: every word of the text, in order, at the frame that read its
first token, before the audio that holds it."""

from __future__ import annotations

from tests.conftest import running_gateway
from tests.realtime.test_websocket_qwen3 import TEXT, TINY
from tests.realtime.test_word_timing import _check_words
from voicewire.engine import Engine, EngineConfig
from voicewire.realtime.client import ReceivedAudio, TurnWords, VoicewireClient
from voicewire.realtime.client.simulated_llm import tokens_of

FRAME_MS = 80.0


async def test_qwen3_words_cover_the_text_in_reading_order_before_their_audio() -> None:
    engine = Engine(EngineConfig(model="qwen3-tts", model_options=dict(TINY))).start()
    try:
        async with running_gateway(engine) as base, await VoicewireClient.connect(f"ws://{base}") as client:
            turn = await client.start_turn("q")
            for token in tokens_of(TEXT):
                await turn.send(token)
            await turn.end()
            received_ms, order = 0.0, []
            async for event in turn.events():
                if isinstance(event, TurnWords):
                    assert all(w.start_ms >= received_ms for w in event.words), (event, received_ms)
                    order.append("words")
                else:
                    assert isinstance(event, ReceivedAudio)
                    received_ms += event.duration_s * 1000
                    order.append("audio")
            done = await turn.done()
        words = turn.words()
    finally:
        engine.close()
    assert done.reason == "completed" and order[0] == "words"
    assert [w.word for w in words] == TEXT.split()  # every word once, in order
    _check_words(words, TEXT)
    assert all(w.start_ms % FRAME_MS == 0 and w.end_ms - w.start_ms >= FRAME_MS for w in words)  # whole frames
    assert words[-1].start_ms < done.audio_ms  # random weights speak 3 frames per token: all read
