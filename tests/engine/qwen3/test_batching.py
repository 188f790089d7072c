"""Continuous batching: streams join and leave between steps; cancelled slots are reused cleanly."""

from __future__ import annotations

import gc
from collections import deque
from collections.abc import Callable

import numpy as np
import torch

from voicewire.engine.model import DecodeWork, GenerateResult, StreamParams
from voicewire.engine.qwen3 import Qwen3TTSModel
from voicewire.engine.qwen3.host_slot import HostSlot, invalid_rows
from voicewire.engine.qwen3.tokenizer import TextStream

from .conftest import run_stream

# (slot, join at step, text, params): different voices, languages, lengths, and one sampled stream
STREAMS = [
    (0, 0, "Hello world, this is a test.", StreamParams(voice="ryan", greedy=True, forced_frames=14, seed=1)),
    (
        3,
        2,
        "The quick brown fox.",
        StreamParams(voice="vivian", language="english", greedy=True, forced_frames=6),
    ),
    (1, 4, "Good morning!", StreamParams(voice="eric", language="chinese", greedy=True, forced_frames=11)),
    (5, 5, "Sampled, with a seed.", StreamParams(voice="aiden", greedy=False, forced_frames=9, seed=1234)),
    (2, 9, "Late joiner.", StreamParams(voice="serena", greedy=True, forced_frames=7)),
]


def _alone(model: Qwen3TTSModel) -> dict[int, np.ndarray]:
    return {slot: run_stream(model, 4, [text], params) for slot, _, text, params in STREAMS}


def test_streams_joining_and_leaving_give_the_codes_they_give_alone(tiny: Qwen3TTSModel) -> None:
    alone = _alone(tiny)
    got: dict[int, list[np.ndarray]] = {slot: [] for slot, *_ in STREAMS}
    live: list[int] = []
    batch_sizes = []
    for step in range(60):
        for slot, join, text, params in STREAMS:
            if join == step:
                tiny.open_slot(slot, params)
                tiny.add_text(slot, [text], True)
                live.append(slot)
        ready = [s for s in live if tiny.ready(s)]
        if not ready and step > max(j for _, j, *_ in STREAMS):
            break
        batch_sizes.append(len(ready))
        for r in tiny.generate(ready):
            if r.frames is not None:
                got[r.slot].append(r.frames)
            if r.finished:
                live.remove(r.slot)
                tiny.close_slot(r.slot)
    assert max(batch_sizes) >= 4 and not live
    for slot, _, _, params in STREAMS:
        codes = np.concatenate(got[slot])
        assert codes.shape == (params.forced_frames, 16)
        np.testing.assert_array_equal(codes, alone[slot], err_msg=f"slot {slot}")


def test_sampling_depends_on_the_seed_only(tiny: Qwen3TTSModel) -> None:
    p = StreamParams(voice="ryan", forced_frames=8, seed=77)
    a = run_stream(tiny, 0, ["Same seed."], p)
    b = run_stream(tiny, 5, ["Same seed."], p)
    c = run_stream(tiny, 0, ["Same seed."], StreamParams(voice="ryan", forced_frames=8, seed=78))
    np.testing.assert_array_equal(a, b)
    assert (a != c).any()


def _tensor_bytes() -> int:
    gc.collect()
    # type(), not isinstance(): the latter trips deprecation shims among gc's objects
    tensors = [o for o in gc.get_objects() if issubclass(type(o), torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in tensors)


def test_cancelled_slot_is_reused_without_leaks(tiny: Qwen3TTSModel) -> None:
    text, params = "Reuse me after a cancel.", StreamParams(voice="vivian", greedy=True, forced_frames=10)
    reference = run_stream(tiny, 2, [text], params)  # on a slot nobody cancelled
    baseline = None
    for cycle in range(4):
        # a stream that is cancelled mid-utterance, leaving KV rows, codec state, repetition
        # history and pending text behind in slot 0
        tiny.open_slot(0, StreamParams(voice="ryan", forced_frames=30, seed=cycle))
        tiny.add_text(0, ["Cancelled ", "midway ", "through "], False)
        for _ in range(3):
            tiny.generate([0])
        frames = np.random.default_rng(cycle).integers(0, 2048, (3, 16))
        tiny.decode([DecodeWork(0, [frames], 3, False)])
        tiny.close_slot(0)
        assert not tiny.ready(0)
        codes = run_stream(tiny, 0, [text], params)
        np.testing.assert_array_equal(codes, reference)
        if baseline is None:
            baseline = _tensor_bytes()
        else:
            assert _tensor_bytes() == baseline
    assert not tiny._slots


def test_steps_begun_two_at_a_time_give_the_codes_of_one_at_a_time(tiny: Qwen3TTSModel) -> None:
    """The engine queues a step behind the begun one before taking its codes (Model.steps_in_flight):
    readiness counts the begun frames, so no stream is stepped past its length or past the text it
    has (the tiny model's greedy codes do not depend on its text: the device's text queue says it),
    and the codes are those of steps taken one at a time. Text arrives a word every fourth step
    (a word is 2-3 tokens: a stream that reads a token a frame waits for most of its text)."""
    alone = _alone(tiny)
    got: dict[int, list[np.ndarray]] = {slot: [] for slot, *_ in STREAMS}
    words = {slot: text.split() for slot, _, text, _ in STREAMS}
    live: list[int] = []
    begun: deque[Callable[[], list[GenerateResult]]] = deque()
    most_begun = 0
    for step in range(120):
        for slot, join, _, params in STREAMS:
            if join == step:
                tiny.open_slot(slot, params)
                live.append(slot)
            if join <= step and words[slot] and (step - join) % 4 == 0:
                word = words[slot].pop(0)
                tiny.add_text(slot, [word if not words[slot] else word + " "], not words[slot])
        ready = [s for s in live if tiny.ready(s)]
        if ready:
            begun.append(tiny.generate_start(ready))
            most_begun = max(most_begun, len(begun))
            for s in ready:  # frame k > 0 is fed text token k: it was there, or the text had ended
                k = int(tiny.state.frames[s]) - 1
                assert k == 0 or k < int(tiny.state.text_len[s]) or not words[s], (step, s, k)
        if begun and (len(begun) == 2 or not ready):
            for r in begun.popleft()():
                if r.frames is not None:
                    got[r.slot].append(r.frames)
                if r.finished and r.slot in live:
                    live.remove(r.slot)  # closed once no begun step has it (all at the end here)
        if not live and not begun:
            break
    assert most_begun == 2 and not live
    for slot, _, _, params in STREAMS:
        codes = np.concatenate(got[slot])
        assert codes.shape == (params.forced_frames, 16)
        np.testing.assert_array_equal(codes, alone[slot], err_msg=f"slot {slot}")
        tiny.close_slot(slot)


def test_a_frame_begun_after_the_step_that_ended_the_stream_is_dropped(tiny: Qwen3TTSModel) -> None:
    """A stop token is seen only when the codes are recorded, so a step begun behind the one that
    made it may have stepped the stream once more: that frame is not the stream's."""
    limits = tiny.limits
    st = HostSlot(TextStream(tiny.tokenizer), None, None, [], None, (True, True), False, None)
    st.text.push(["Two words"], False)
    st.prefilled, st.begun = True, 2
    eos = np.full((1, 16), 0, np.int64)
    eos[0, 0] = limits.eos_id
    first = st.record(0, eos, limits.eos_id, False, limits)
    second = st.record(0, np.ones((1, 16), np.int64), 1, False, limits)
    assert (first.n_frames, first.finished) == (0, True)
    assert (second.n_frames, second.finished, second.frames) == (0, True, None)
    assert st.frames == 0 and st.begun == 0 and not st.ready(limits)


def test_invalid_rows_flags_codes_the_codec_cannot_decode() -> None:
    """Out of range either way (a negative code too) in any codebook, except EOS in codebook 0."""
    eos, size = 2150, 2048
    rows = np.full((6, 16), 7, np.int64)
    rows[1, 0] = eos  # the stop code: fine in codebook 0
    rows[2, 5] = eos  # not in codebooks 1..15
    rows[3, 0] = -1
    rows[4, 15] = size
    rows[5, 0] = size - 1
    assert invalid_rows(rows, size, eos).tolist() == [False, False, True, True, True, False]
    rng = np.random.default_rng(0)
    many = rng.integers(-3, size + 3, (64, 16))
    many[::3, 0] = eos
    ok0 = ((many[:, 0] >= 0) & (many[:, 0] < size)) | (many[:, 0] == eos)
    ok_rest = ((many[:, 1:] >= 0) & (many[:, 1:] < size)).all(axis=1)
    np.testing.assert_array_equal(invalid_rows(many, size, eos), ~(ok0 & ok_rest))
