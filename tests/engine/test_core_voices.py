"""Cloned voices through an engine core: the clone command and a stream that speaks with the voice.

A real core process with the tiny random Qwen3-TTS Base model against the same model in process:
the core's voice is the in-process one, bit for bit, and a stream given it through the core speaks
what the in-process stream speaks (greedy, forced length), which is not what the default voice speaks.
"""

from __future__ import annotations

import numpy as np
import pytest

from voicewire.engine import (
    CLONED_VOICE_KEY,
    ClonedVoice,
    CloningNotSupported,
    Engine,
    EngineConfig,
    StreamParams,
)
from voicewire.engine.core import CoreClient
from voicewire.engine.core.messages import OpenStream, decode_to_core, encode_to_core

from .qwen3.oracle import reference_audio

TINY_BASE = {"size": "tiny-base", "seed": 3, "max_slots": 2, "max_batch_size": 2, "max_seq_len": 256}
CONFIG = EngineConfig(model="qwen3-tts", model_options=TINY_BASE)
RATE_HZ = 24_000
TEXT = "A cloned voice, spoken through the core."


def _greedy(voice: ClonedVoice | None) -> StreamParams:
    extra: dict[str, object] = {} if voice is None else {CLONED_VOICE_KEY: voice}
    return StreamParams(greedy=True, seed=0, forced_frames=5, extra=extra)


async def _speak(engine: Engine | CoreClient, params: StreamParams) -> np.ndarray:
    stream = engine.open_stream(params)
    stream.push_text(TEXT)
    stream.end()
    return np.concatenate([c.pcm async for c in stream])


def test_a_cloned_voice_crosses_the_wire_whole() -> None:
    codes = np.arange(32, dtype=np.int32).reshape(2, 16)
    voice = ClonedVoice("enc", {"speaker_embedding": np.linspace(-1, 1, 8, dtype=np.float32), "ref_codes": codes}, "hi")
    msg = decode_to_core(encode_to_core(OpenStream(7, _greedy(voice))))
    assert isinstance(msg, OpenStream)
    back = msg.params.extra[CLONED_VOICE_KEY]
    assert isinstance(back, ClonedVoice) and (back.encoder, back.ref_text) == ("enc", "hi")
    for name, a in voice.arrays.items():
        assert back.arrays[name].dtype == a.dtype and np.array_equal(back.arrays[name], a)


async def test_clone_and_speak_through_a_core_as_in_process() -> None:
    clip = reference_audio(1.5, RATE_HZ, seed=6)
    local = Engine(CONFIG).start()
    try:
        async with CoreClient(CONFIG) as core:
            assert core.info.voice_encoder == local.info.voice_encoder != ""
            remote = await core.clone_voice(clip, RATE_HZ, "Hello world.")
            here = await local.clone_voice(clip, RATE_HZ, "Hello world.")
            assert remote.encoder == here.encoder and set(remote.arrays) == {"speaker_embedding", "ref_codes"}
            for name in here.arrays:
                assert np.array_equal(remote.arrays[name], here.arrays[name]), name
            assert local.stats.voices_cloned == 1
            with pytest.raises(ValueError, match="too short"):
                await core.clone_voice(clip[:500], RATE_HZ)
            cloned = await _speak(core, _greedy(remote))
            assert np.array_equal(cloned, await _speak(local, _greedy(here)))
            assert not np.array_equal(cloned, await _speak(core, _greedy(None)))
            # a voice of another encoder is refused when its stream opens, not spoken wrongly
            alien = ClonedVoice("another-encoder", dict(remote.arrays), remote.ref_text)
            with pytest.raises(Exception, match="another-encoder"):
                await _speak(core, _greedy(alien))
    finally:
        local.close()


async def test_the_embedded_voice_refuses_cloning(engine: Engine) -> None:
    assert engine.info.voice_encoder == ""
    with pytest.raises(CloningNotSupported):
        await engine.clone_voice(reference_audio(1.5, RATE_HZ, seed=1), RATE_HZ)
