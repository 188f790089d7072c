"""The per-turn model-time budget: a turn whose text costs model time without making audio ends
with ``text_budget_exceeded``; a turn beside it is unaffected."""

from __future__ import annotations

import time

import pytest

from voicewire.engine import Engine, EngineConfig, StreamError, TextConfig
from voicewire.engine.models.hibari_voice import HibariModel, _Utterance
from voicewire.engine.stream import AudioChunk, Stream

SLOW_CLAUSE_S = 0.05


class _SlowSilentFrontEnd(HibariModel):
    """Clauses with the word "slow" take SLOW_CLAUSE_S to phonemize and make no sound: the shape of
    a front end's worst case on text the voice cannot read."""

    def _utterances(self, clause: str, text: str, first: bool = False) -> list[_Utterance]:
        if "slow" in clause:
            time.sleep(SLOW_CLAUSE_S)
            return []
        return super()._utterances(clause, text, first)


async def _collect(s: Stream) -> list[AudioChunk]:
    return [c async for c in s]


async def test_a_turn_over_its_model_time_budget_ends_and_its_neighbour_completes() -> None:
    budget_s = 0.3
    config = EngineConfig(
        max_streams=4, text=TextConfig(turn_budget_s=budget_s, turn_budget_per_audio_s=0.25)
    )
    eng = Engine(config, model=_SlowSilentFrontEnd(max_slots=4)).start()
    try:
        bad, good = eng.open_stream(), eng.open_stream(seed=0)
        t0 = time.perf_counter()
        bad.push_text("slow words here. " * 100)  # 100 clauses: 5 s of model time if let run
        bad.end()
        good.push_text("This turn speaks normally while the other one burns its budget.")
        good.end()
        with pytest.raises(StreamError) as err:
            await _collect(bad)
        elapsed_s = time.perf_counter() - t0
        assert err.value.code == "text_budget_exceeded"
        assert budget_s <= elapsed_s < budget_s + 1.0
        chunks = await _collect(good)
        assert chunks[-1].final and sum(c.pcm.size for c in chunks) > 24_000
    finally:
        eng.close()


async def test_real_speech_is_not_stopped_by_the_default_budget(engine: Engine) -> None:
    # A long turn of prose (over 30 s of audio) costs about 0.01 s of model time per audio second.
    s = engine.open_stream(seed=0)
    s.push_text("The quick brown fox jumps over the lazy dog, and then it rests for a while. " * 12)
    s.end()
    chunks = await _collect(s)
    audio_s = sum(c.pcm.size for c in chunks) / 24_000
    assert chunks[-1].final and audio_s > 30
