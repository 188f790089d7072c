"""The stateful streaming codec decoder: streamed PCM == offline decode, causality, the windowed reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from voicewire.engine.config import ChunkSchedule
from voicewire.engine.model import DecodeWork, StreamParams
from voicewire.engine.qwen3 import Qwen3TTSModel

STREAM_TOL = 1e-5  # fp32
N_FRAMES = 110  # past the 72-frame attention window
SCHEDULES = {
    "engine-default-1-2-4-8-12": ChunkSchedule(),
    "first-1-then-1": ChunkSchedule(first_frames=1, ramp_frames=(), steady_frames=1),
    "first-2-3-then-7": ChunkSchedule(first_frames=2, ramp_frames=(3,), steady_frames=7),
    "first-1-then-40": ChunkSchedule(first_frames=1, ramp_frames=(), steady_frames=40),
    # the lengths the slack-following cadence reaches (ChunkSchedule.slack_frames)
    "ramp-to-12-then-24-then-48": ChunkSchedule(first_frames=1, ramp_frames=(2, 4, 8, 12, 24), steady_frames=48),
}


def _codes(seed: int, n: int = N_FRAMES) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 2048, size=(n, 16), dtype=np.int64)


def _offline(model: Qwen3TTSModel, codes: np.ndarray) -> np.ndarray:
    return model.codec.decode(torch.from_numpy(codes).T[None].to(model.device))[0].cpu().numpy()


def _chunks(schedule: ChunkSchedule, n: int) -> list[tuple[int, int]]:
    out, start, i = [], 0, 0
    while start < n:
        size = min(schedule.frames_for(i), n - start)
        out.append((start, start + size))
        start, i = start + size, i + 1
    return out


def _open(model: Qwen3TTSModel, slot: int) -> None:
    model.open_slot(slot, StreamParams(greedy=True, seed=0))


def _stream(
    model: Qwen3TTSModel, streams: dict[int, np.ndarray], schedule: ChunkSchedule
) -> dict[int, np.ndarray]:
    """Decode several slots' frames chunk by chunk through Model.decode, batched per tick."""
    plans = {slot: _chunks(schedule, len(c)) for slot, c in streams.items()}
    out: dict[int, list[np.ndarray]] = {slot: [] for slot in streams}
    for tick in range(max(len(p) for p in plans.values())):
        work = []
        for slot, plan in plans.items():
            if tick < len(plan):
                a, b = plan[tick]
                frames = [streams[slot][i : i + 1] for i in range(a, b)]  # one payload per frame
                work.append(DecodeWork(slot, frames, b - a, final=tick == len(plan) - 1))
        for w, pcm in zip(work, model.decode(work), strict=True):
            assert pcm.dtype == np.float32 and pcm.shape == (w.n_frames * 1920,)
            out[w.slot].append(pcm)
    return {slot: np.concatenate(p) for slot, p in out.items()}


@pytest.mark.parametrize("schedule", SCHEDULES.values(), ids=SCHEDULES.keys())
def test_streamed_pcm_equals_offline_decode(tiny: Qwen3TTSModel, schedule: ChunkSchedule) -> None:
    # two slots decoded side by side (batched when their chunks have the same length)
    streams = {1: _codes(1), 4: _codes(2)}
    for slot in streams:
        _open(tiny, slot)
    streamed = _stream(tiny, streams, schedule)
    for slot, codes in streams.items():
        offline = _offline(tiny, codes)
        assert offline.std() > 1e-3
        np.testing.assert_allclose(streamed[slot], offline, rtol=0, atol=STREAM_TOL)
        tiny.close_slot(slot)


def test_slots_with_different_chunk_lengths_in_one_call(tiny: Qwen3TTSModel) -> None:
    a, b = _codes(5, 30), _codes(6, 30)
    _open(tiny, 0)
    _open(tiny, 2)
    first = tiny.decode([DecodeWork(0, [a[:1]], 1, False), DecodeWork(2, [b[:5]], 5, False)])
    second = tiny.decode([DecodeWork(2, [b[5:]], 25, True), DecodeWork(0, [a[1:]], 29, True)])
    np.testing.assert_allclose(
        np.concatenate([first[0], second[1]]), _offline(tiny, a), rtol=0, atol=STREAM_TOL
    )
    np.testing.assert_allclose(
        np.concatenate([first[1], second[0]]), _offline(tiny, b), rtol=0, atol=STREAM_TOL
    )
    tiny.close_slot(0)
    tiny.close_slot(2)


def test_more_frames_never_change_audio_already_emitted(tiny: Qwen3TTSModel) -> None:
    codes = _codes(7)
    full = _offline(tiny, codes)
    for n in (1, 2, 9, 71, 72, 73, 100):
        prefix = _offline(tiny, codes[:n])
        np.testing.assert_allclose(
            prefix, full[: n * 1920], rtol=0, atol=STREAM_TOL, err_msg=f"prefix of {n} frames"
        )
    # and a change in frame k leaves every sample before frame k untouched (bit-for-bit causal)
    changed = codes.copy()
    changed[80] = (changed[80] + 1) % 2048
    other = _offline(tiny, changed)
    np.testing.assert_allclose(other[: 80 * 1920], full[: 80 * 1920], rtol=0, atol=STREAM_TOL)
    assert np.abs(other[80 * 1920 :] - full[80 * 1920 :]).max() > 1e-3


def test_reused_slot_starts_from_a_fresh_decoder_state(tiny: Qwen3TTSModel) -> None:
    first, second = _codes(8, 20), _codes(9, 20)
    _open(tiny, 3)
    tiny.decode([DecodeWork(3, [first], 20, True)])
    tiny.close_slot(3)
    _open(tiny, 3)
    again = tiny.decode([DecodeWork(3, [second[:4]], 4, False), DecodeWork(5, [], 0, False)][:1])[0]
    np.testing.assert_allclose(again, _offline(tiny, second[:4]), rtol=0, atol=STREAM_TOL)
    tiny.close_slot(3)


def test_windowed_redecode_reference(tiny: Qwen3TTSModel) -> None:
    """The stateless path: exact while its left context covers the stream, an approximation after."""
    codes = _codes(10)
    offline = _offline(tiny, codes)
    t = torch.from_numpy(codes).T[None].to(tiny.device)
    # context covering everything before the chunk: the same samples as the offline decode
    last = tiny.codec.decode_windowed(t, n_new=10, left_context=N_FRAMES)[0].cpu().numpy()
    np.testing.assert_allclose(last, offline[-10 * 1920 :], rtol=0, atol=STREAM_TOL)
    # 72 frames of context (the deploy default the vLLM-Omni fix settled on): exact up to frame 72+n,
    # then close to but not equal to the offline decode (receptive field > 72 frames)
    early = tiny.codec.decode_windowed(t[..., :80], n_new=8, left_context=72)[0].cpu().numpy()
    np.testing.assert_allclose(early, offline[72 * 1920 : 80 * 1920], rtol=0, atol=STREAM_TOL)
    late = tiny.codec.decode_windowed(t, n_new=10, left_context=72)[0].cpu().numpy()
    err = np.abs(late - offline[-10 * 1920 :]).max()
    assert 0 < err < 0.5 * np.abs(offline).max()


def test_windowed_mode_through_the_model_api(device: str) -> None:
    from voicewire.engine.qwen3 import load_qwen3

    model = load_qwen3(
        None, "tiny", device=device, seed=3, max_slots=2, max_batch_size=2, codec_mode="windowed"
    )
    codes = _codes(11, 40)
    model.open_slot(0, StreamParams(seed=0))
    pcm = _stream(model, {0: codes}, ChunkSchedule())[0]
    # 40 frames < 72 frames of context: the windowed path is exact here too
    np.testing.assert_allclose(pcm, _offline(model, codes), rtol=0, atol=STREAM_TOL)
