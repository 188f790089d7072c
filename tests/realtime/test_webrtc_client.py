"""The Python WebRTC client (an aiortc peer) against a real gateway: barge-in after ~1 s of speech."""

from __future__ import annotations

import asyncio

import numpy as np

from tests.conftest import running_gateway
from tests.realtime.test_client import LONG_REPLY, _check_prefix, fake_chat_completion
from voicewire.engine import Engine
from voicewire.realtime.client import ReceivedAudio
from voicewire.realtime.client.webrtc import SAMPLE_RATE_HZ, WebRtcClient


async def test_barge_in_reports_the_audio_paced_out_and_its_words(engine: Engine) -> None:
    async with running_gateway(engine) as base:
        client = await WebRtcClient.connect(f"http://{base}")
        # Text far ahead of speech: only the pacer decides how much of the turn is heard.
        turn = client.speak(fake_chat_completion(LONG_REPLY, tokens_per_s=40))
        frames: list[ReceivedAudio] = []

        async def read() -> None:
            async for f in turn:
                frames.append(f)

        reader = asyncio.create_task(read())
        while not any(np.any(f.pcm()) for f in frames):
            await asyncio.sleep(0.005)
        await asyncio.sleep(1.0)  # ~1 s of speech has played out of aiortc's receiver
        done = await turn.cancel()
        await reader
        stats = await client.receiver_stats()
        await client.close()

    assert done.reason == "cancelled"
    assert 900 < done.played_ms < done.audio_ms
    # What arrived: the turn's frames with sound (the server sends digital silence around a turn).
    sound = [f for f in frames if np.any(f.pcm())]
    received_ms = sum(f.duration_s for f in sound) * 1000
    assert abs(done.played_ms - received_ms) <= 100, (done.played_ms, received_ms)
    pcm = np.concatenate([f.pcm() for f in sound]).astype(np.float32) / 32768.0
    _check_prefix(done.text_spoken, LONG_REPLY, pcm, SAMPLE_RATE_HZ)
    assert stats["packets_received"] > 0 and stats["packets_lost"] == 0
