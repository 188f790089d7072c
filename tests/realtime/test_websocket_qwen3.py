"""Protocol v1 end to end with the tiny random-weight Qwen3-TTS behind the gateway."""

from __future__ import annotations

import asyncio
import json

import websockets

from tests.conftest import TurnResult, read_turn, running_gateway, send_words
from voicewire.engine import Engine, EngineConfig

TINY = {"size": "tiny", "seed": 3, "max_slots": 4, "max_batch_size": 4, "max_seq_len": 256}
FRAME_BYTES = 1920 * 2  # one 80 ms codec frame of pcm16 at 24 kHz
TEXT = "Hello there, this is the tiny random model speaking over the WebSocket."


async def test_websocket_turn_with_tiny_qwen3() -> None:
    engine = Engine(EngineConfig(model="qwen3-tts", model_options=dict(TINY))).start()
    try:
        # The same text straight through the engine: random weights speak 3 frames per text token.
        direct = engine.open_stream()
        words = TEXT.split(" ")
        for i, word in enumerate(words):  # the same deltas as send_words below
            direct.push_text(word if i == len(words) - 1 else word + " ")
        direct.end()
        expected_samples = sum([c.pcm.size async for c in direct])
        assert expected_samples % 1920 == 0 and expected_samples >= 10 * 1920

        async with running_gateway(engine) as base:
            ws = await websockets.connect(f"ws://{base}/v1/stream", max_size=None)
            created = json.loads(await ws.recv())
            assert created["voices"][0] and created["audio"]["sample_rate"] == 24_000
            res = TurnResult(turn_id="q")
            reader = asyncio.create_task(read_turn(ws, res))
            await send_words(ws, "q", TEXT, words_per_s=40)
            await reader
            await ws.close()
        assert res.done is not None and res.done["reason"] == "completed"
        assert res.audio_sizes[0] == FRAME_BYTES, "the first chunk is one frame"
        assert len(res.audio_sizes) > 3  # chunks as scheduled (1, 2, 4, 8, 12 frames...)
        assert len(res.audio) == expected_samples * 2
        assert res.done["audio_ms"] == expected_samples / 24
    finally:
        engine.close()
