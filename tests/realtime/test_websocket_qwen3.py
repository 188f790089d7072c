"""Protocol v1 end to end with the tiny random-weight Qwen3-TTS behind the gateway."""

from __future__ import annotations

from tests.conftest import running_gateway, speak_turn
from voicewire.engine import Engine, EngineConfig
from voicewire.realtime.client import VoicewireClient
from voicewire.realtime.client.simulated_llm import tokens_of

TINY = {"size": "tiny", "seed": 3, "max_slots": 4, "max_batch_size": 4, "max_seq_len": 256}
FRAME_BYTES = 1920 * 2  # one 80 ms codec frame of pcm16 at 24 kHz
TEXT = "Hello there, this is the tiny random model speaking over the WebSocket."


async def test_websocket_turn_with_tiny_qwen3() -> None:
    engine = Engine(EngineConfig(model="qwen3-tts", model_options=dict(TINY))).start()
    try:
        # The same text straight through the engine: random weights speak 3 frames per text token.
        direct = engine.open_stream()
        for token in tokens_of(TEXT):  # the same deltas as speak_turn below
            direct.push_text(token)
        direct.end()
        expected_samples = sum([c.pcm.size async for c in direct])
        assert expected_samples % 1920 == 0 and expected_samples >= 10 * 1920

        async with running_gateway(engine) as base, await VoicewireClient.connect(f"ws://{base}") as client:
            assert client.session["voices"][0] and client.sample_rate_hz == 24_000
            _, heard = await speak_turn(client, TEXT, 40, "q")
        assert heard.done.reason == "completed"
        assert len(heard.chunks[0].data) == FRAME_BYTES, "the first chunk is one frame"
        assert len(heard.chunks) > 3  # chunks as scheduled (1, 2, 4, 8, 12 frames...)
        assert len(heard.data) == expected_samples * 2
        assert heard.done.audio_ms == expected_samples / 24
    finally:
        engine.close()
