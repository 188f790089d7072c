"""Runaway guards (guards.py): the detector on synthetic codes, then two doubles of a real checkpoint
(random weights loaded as a checkpoint, so EOS is not masked and no length is forced) that end with
stop reason ``length`` within their budget, through the model and through the engine."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from voicewire.engine import Engine, EngineConfig, StreamParams
from voicewire.engine.model import ModelError
from voicewire.engine.qwen3 import Qwen3TTSModel, load_qwen3
from voicewire.engine.qwen3.guards import MAX_PERIOD_FRAMES, REPEAT_FRAMES, GuardLimits, RepetitionDetector
from voicewire.engine.qwen3.testing import write_random_checkpoint

TEXT = ["Hello ", "there."]
OPTIONS = {"max_slots": 2, "max_batch_size": 2, "max_seq_len": 256}


# --- the detector and the budget on their own --------------------------------------------------------
def _first_trip(codes: np.ndarray, repeat_frames: int = REPEAT_FRAMES) -> int | None:
    det = RepetitionDetector(1)
    det.open(0, repeat_frames)
    for t, c in enumerate(codes, 1):
        if det.push(np.array([0]), np.array([c]))[0]:
            return t
    return None


@pytest.mark.parametrize("period", [1, 2, 7, MAX_PERIOD_FRAMES])
def test_a_cycle_trips_once_it_has_run_repeat_frames(period: int) -> None:
    rng = np.random.default_rng(period)
    speech = rng.permutation(2048)[:40]  # 40 frames that never repeat, then the loop
    cycle = np.tile(rng.permutation(2048)[:period], 100)
    assert _first_trip(np.concatenate([speech, cycle])) == 40 + REPEAT_FRAMES


def test_varied_codes_longer_cycles_and_an_off_row_never_trip() -> None:
    rng = np.random.default_rng(0)
    assert _first_trip(rng.integers(0, 2048, 5000)) is None  # chance repeats of random codes
    assert _first_trip(np.tile(np.arange(MAX_PERIOD_FRAMES + 1), 50)) is None  # beyond the window
    assert _first_trip(np.zeros(500, np.int64), repeat_frames=0) is None


def test_rows_are_independent() -> None:
    det = RepetitionDetector(3)
    for s in range(3):
        det.open(s, REPEAT_FRAMES)
    rng = np.random.default_rng(1)
    slots = np.array([2, 0])  # any order, any subset
    for t in range(1, REPEAT_FRAMES + 1):
        looped = det.push(slots, np.array([7, rng.integers(0, 2048)]))
        assert looped.tolist() == [t == REPEAT_FRAMES, False]
    det.open(2, REPEAT_FRAMES)  # a new stream in the slot starts clean
    assert not det.push(np.array([2]), np.array([7]))[0]


def test_the_budget_is_generous_and_configurable() -> None:
    limits = GuardLimits()
    assert limits.frame_budget(1) == 75  # 6 s floor for a one-token text
    assert limits.frame_budget(100) == 800  # 0.64 s per token
    custom = GuardLimits.from_extra({"min_frames": 10, "frames_per_token": 2, "repeat_frames": 0})
    assert (custom.frame_budget(3), custom.repeat_frames) == (10, 0)
    for bad in ({"min_frames": 0}, {"frames_per_token": "x"}, {"repeat_frames": 5}):
        with pytest.raises(ValueError):
            GuardLimits.from_extra(bad)


# --- doubles of a real checkpoint --------------------------------------------------------------------
@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("ckpt")
    write_random_checkpoint(str(d), "tiny", seed=5)
    return d


@pytest.fixture(scope="module")
def never_eos(checkpoint: Path) -> Qwen3TTSModel:
    """Greedy on these weights never samples EOS and never repeats (checked: 500 frames)."""
    model = load_qwen3(str(checkpoint), **OPTIONS)  # type: ignore[arg-type]
    assert not model.random_weights
    return model


class StuckHead(nn.Module):
    """A codec head that prefers code 0 by a margin no sampling setting overcomes: the talker says
    the same frame forever and never EOS (the unfused path the CPU runs calls the module)."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab = vocab

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = torch.zeros(*hidden.shape[:-1], self.vocab, dtype=hidden.dtype)
        logits[..., 0] = 1e4
        return logits


def _looping(checkpoint: Path) -> Qwen3TTSModel:
    model = load_qwen3(str(checkpoint), **OPTIONS)  # type: ignore[arg-type]
    model.talker.codec_head = StuckHead(model.cfg.talker.vocab_size)
    return model


@pytest.fixture(scope="module")
def looping(checkpoint: Path) -> Qwen3TTSModel:
    return _looping(checkpoint)


def _run(model: Qwen3TTSModel, slots: dict[int, StreamParams]) -> dict[int, tuple[np.ndarray, str | None]]:
    """Streams on these slots in one batch until each stops -> (codebook-0 codes, stop reason)."""
    codes: dict[int, list[int]] = {s: [] for s in slots}
    reasons: dict[int, str | None] = {}
    for s, params in slots.items():
        model.open_slot(s, params)
        model.add_text(s, TEXT, True)
    while live := [s for s in slots if s not in reasons]:
        for s, r in zip(live, model.generate(live), strict=True):
            if r.frames is not None:
                codes[s].append(int(r.frames[0, 0]))
            if r.finished:
                reasons[s] = r.stop_reason
                model.close_slot(s)
    return {s: (np.array(codes[s]), reasons[s]) for s in slots}


def test_a_stream_that_never_stops_ends_at_its_frame_budget(never_eos: Qwen3TTSModel) -> None:
    tokens = len(never_eos.tokenizer.encode("".join(TEXT)))
    assert GuardLimits().frame_budget(tokens) == 75
    codes, reason = _run(never_eos, {0: StreamParams(greedy=True)})[0]
    assert (codes.size, reason) == (75, "length")
    assert tokens * 8 == 40  # the per-token budget is under the floor here
    tight = {"min_frames": 12, "frames_per_token": 1.0}
    codes, reason = _run(never_eos, {1: StreamParams(greedy=True, extra=tight)})[1]
    assert (codes.size, reason) == (12, "length")


def test_a_looping_stream_ends_after_repeat_frames(looping: Qwen3TTSModel) -> None:
    codes, reason = _run(looping, {0: StreamParams(greedy=True)})[0]
    assert reason == "length" and codes.size == REPEAT_FRAMES and set(codes.tolist()) == {0}
    # without the detector the frame budget still stops it
    codes, reason = _run(looping, {0: StreamParams(greedy=True, extra={"repeat_frames": 0})})[0]
    assert (codes.size, reason) == (75, "length")


def test_a_guarded_stream_leaves_its_batch_mates_alone(never_eos: Qwen3TTSModel) -> None:
    long = StreamParams(greedy=True, extra={"min_frames": 60})
    alone = _run(never_eos, {1: long})[1]
    short = StreamParams(greedy=True, extra={"min_frames": 10, "frames_per_token": 1.0})
    both = _run(never_eos, {0: short, 1: long})
    assert (both[0][0].size, both[0][1]) == (10, "length")
    np.testing.assert_array_equal(both[1][0], alone[0])
    assert (both[1][0].size, both[1][1]) == (60, "length")


def test_forced_lengths_are_not_guarded_and_bad_limits_are_refused(looping: Qwen3TTSModel) -> None:
    codes, reason = _run(looping, {0: StreamParams(greedy=True, forced_frames=90)})[0]
    assert (codes.size, reason) == (90, None)  # the length asked for, not cut by the detector
    with pytest.raises(ModelError, match="min_frames"):
        looping.open_slot(0, StreamParams(extra={"min_frames": -1}))


async def test_the_engine_hands_the_stop_reason_to_the_stream(checkpoint: Path) -> None:
    model = _looping(checkpoint)
    async with Engine(EngineConfig(model="qwen3-tts"), model=model) as engine:
        looped = engine.open_stream(StreamParams())  # sampled: stuck all the same
        normal = engine.open_stream(StreamParams(greedy=True, forced_frames=8))
        for s in (looped, normal):
            s.push_text("".join(TEXT))
            s.end()

        async def samples(s):  # type: ignore[no-untyped-def]
            return sum([c.pcm.size async for c in s])

        got = await asyncio.wait_for(asyncio.gather(samples(looped), samples(normal)), 60)
    assert looped.stop_reason == "length" and got[0] == REPEAT_FRAMES * 1920
    assert normal.stop_reason is None and got[1] == 8 * 1920


async def test_a_guarded_turn_is_done_with_reason_length(checkpoint: Path) -> None:
    pytest.importorskip("aiohttp")  # the GPU machine runs the engine tests without the transport packages
    from tests.conftest import running_gateway, speak_turn
    from voicewire.realtime.client import VoicewireClient

    model = _looping(checkpoint)
    async with (
        Engine(EngineConfig(model="qwen3-tts"), model=model) as engine,
        running_gateway(engine) as base,
        await VoicewireClient.connect(f"ws://{base}") as client,
    ):
        _, heard = await speak_turn(client, "".join(TEXT), None, "loop", timeout_s=60)
    assert heard.done.reason == "length", heard.done
    assert heard.done.audio_ms == heard.done.played_ms == REPEAT_FRAMES * 80  # before the 75-frame budget
