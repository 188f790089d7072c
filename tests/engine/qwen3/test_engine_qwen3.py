"""The tiny random Qwen3-TTS through the real Engine: chunks as scheduled, the audio the model makes."""

from __future__ import annotations

import asyncio

import numpy as np
import torch

from voicewire.engine import Engine, EngineConfig, StreamParams
from voicewire.engine.qwen3 import load_qwen3

from .conftest import run_stream

OPTIONS = {"size": "tiny", "seed": 9, "max_slots": 4, "max_batch_size": 4, "max_seq_len": 256}
TEXTS = ["Hello there, this is the tiny model.", "A second voice joins.", "And a third one, a little longer."]


async def test_engine_streams_the_models_audio_in_scheduled_chunks() -> None:
    engine = Engine(EngineConfig(model="qwen3-tts", model_options=dict(OPTIONS))).start()
    try:
        params = [
            StreamParams(voice=v, greedy=True, forced_frames=f)
            for v, f in (("ryan", 17), ("vivian", 9), ("eric", 23))
        ]
        streams = []
        for text, p in zip(TEXTS, params, strict=True):
            s = engine.open_stream(p)
            for word in text.split(" "):  # deltas as an LLM sends them
                s.push_text(word + " ")
            s.end()
            streams.append(s)

        async def collect(s):  # type: ignore[no-untyped-def]
            return [c async for c in s]

        results = await asyncio.gather(*(collect(s) for s in streams))
    finally:
        engine.close()
    direct = load_qwen3(None, **{k: v for k, v in OPTIONS.items() if k != "size"}, size="tiny")
    for text, p, s, chunks in zip(TEXTS, params, streams, results, strict=True):
        sizes = [c.pcm.size for c in chunks if c.pcm.size]
        assert sizes[0] == 1920  # the first chunk is one frame (engine default schedule)
        assert s.metrics.trimmed_samples == 0
        pcm = np.concatenate([c.pcm for c in chunks])
        assert pcm.size == p.forced_frames * 1920
        codes = run_stream(direct, 0, [text + " "], p)
        ref = direct.codec.decode(torch.from_numpy(codes).T[None])[0].numpy()
        np.testing.assert_allclose(pcm, ref, rtol=0, atol=1e-5)
