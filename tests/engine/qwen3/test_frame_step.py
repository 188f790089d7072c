"""A stream's first frame: the prefill writes the prompt's KV but its last position, and that position
is fed by the decode step of the same generate() call (frame_step.py). The codes must be those of the
straightforward way, computed from the model's modules by ``prefill_reference`` (conftest.py): the
talker over the whole prompt, the sampling tail on its last hidden state, then one decode step per
frame. Streams alone and sharing steps; streamed, whole-text, sampled, too long for every prefill
bucket (eager), cut to one, two, three positions, and cloned voices.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from voicewire.engine.model import StreamParams
from voicewire.engine.qwen3 import Qwen3TTSModel, ServeOptions, load_qwen3
from voicewire.engine.qwen3.host_slot import HostSlot
from voicewire.engine.qwen3.prompt import Prompt
from voicewire.engine.qwen3.voice_clone import PROFILE_KEY, VoiceCloner

from .conftest import prefill_reference, run_joining, run_stream
from .oracle import reference_audio

SENTENCE = "Hello world, this is a test."
LONG = " ".join(["word"] * 70)  # a whole-text prompt of 81 positions: past the 64-position bucket


@pytest.fixture(scope="module")
def model(device: str) -> Qwen3TTSModel:
    opts = ServeOptions(
        max_slots=6, max_batch_size=6, max_seq_len=256, cuda_graphs=False, prefill_len_buckets=(16, 32, 64)
    )
    return load_qwen3(None, "tiny", device=device, seed=3, options=opts)


CASES = {
    "streamed": (SENTENCE, StreamParams(voice="ryan", greedy=True, forced_frames=7)),
    "sampled": (SENTENCE, StreamParams(voice="aiden", greedy=False, forced_frames=6, seed=1234)),
    "whole-text": (
        SENTENCE,
        StreamParams(voice="vivian", greedy=True, forced_frames=6, extra={"whole_text": True}),
    ),
    "too-long-eager": (
        LONG,
        StreamParams(voice="eric", greedy=True, forced_frames=5, extra={"whole_text": True}),
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_a_stream_alone_gives_the_codes_of_the_whole_prompt_prefill(model: Qwen3TTSModel, case: str) -> None:
    text, params = CASES[case]
    got = run_stream(model, 2, [text], params)
    assert got.shape == (params.forced_frames, 16)
    np.testing.assert_array_equal(got, prefill_reference(model, 2, text, params))


def test_new_and_running_streams_sharing_steps_give_their_reference_codes(model: Qwen3TTSModel) -> None:
    """New streams join running ones in one decode call; a short and a whole-text prompt prefill in
    one group (two lengths, one bucket), the too-long one eagerly beside them."""
    streams = [
        (0, 0, SENTENCE, StreamParams(voice="ryan", greedy=True, forced_frames=9)),
        (3, 1, "The quick brown fox.", StreamParams(voice="vivian", greedy=False, forced_frames=6, seed=7)),
        (
            1,
            1,
            SENTENCE,
            StreamParams(voice="eric", greedy=True, forced_frames=5, extra={"whole_text": True}),
        ),
        (4, 3, LONG, StreamParams(voice="serena", greedy=True, forced_frames=4, extra={"whole_text": True})),
        (5, 3, "Late.", StreamParams(voice="aiden", greedy=False, forced_frames=4, seed=99)),
    ]
    got = run_joining(model, streams, 20)
    for slot, _, text, params in streams:
        np.testing.assert_array_equal(
            got[slot], prefill_reference(model, 2, text, params), err_msg=f"slot {slot}"
        )


@pytest.fixture
def cut(model: Qwen3TTSModel, monkeypatch: pytest.MonkeyPatch) -> dict[int, int]:
    """slot -> n: that slot's prompts are their last n positions (n = 1: codec_bos alone)."""
    full, lengths = model._prompt, {}

    def prompt(st: HostSlot) -> Prompt:
        p = full(st)
        n = lengths.get(next(s for s, v in model._slots.items() if v is st))
        return p if n is None else replace(p, text_ids=p.text_ids[-n:], codec_ids=p.codec_ids[-n:])

    monkeypatch.setattr(model, "_prompt", prompt)
    return lengths


@pytest.mark.parametrize("n", [1, 2, 3])
def test_short_prompts_give_their_reference_codes(model: Qwen3TTSModel, cut: dict[int, int], n: int) -> None:
    cut[0] = n
    params = StreamParams(voice="ryan", greedy=True, forced_frames=5)
    got = run_stream(model, 0, [SENTENCE], params)
    np.testing.assert_array_equal(got, prefill_reference(model, 0, SENTENCE, params))


def test_prompts_of_length_one_alone_and_beside_longer_ones(
    model: Qwen3TTSModel, cut: dict[int, int]
) -> None:
    """Two prompts of length 1 in one step run no talker prefill (their one position is the first
    decode feed); later one of length 1 prefills beside a whole prompt of 9 and one of 17 positions
    (16 talker positions: the first length bucket)."""
    cut.update({0: 1, 1: 1, 2: 1, 4: 17})
    prefills: list[int] = []  # talker calls over more than one position: a decode call feeds one
    hook = model.talker.register_forward_pre_hook(
        lambda _, args: prefills.append(args[0].shape[1]) if args[0].shape[1] > 1 else None
    )
    whole = {"whole_text": True}
    streams = [
        (0, 0, SENTENCE, StreamParams(voice="ryan", greedy=True, forced_frames=6)),
        (1, 0, "Another one.", StreamParams(voice="vivian", greedy=False, forced_frames=5, seed=3)),
        (2, 2, SENTENCE, StreamParams(voice="eric", greedy=True, forced_frames=4)),
        (3, 2, SENTENCE, StreamParams(voice="aiden", greedy=True, forced_frames=4)),
        (4, 2, SENTENCE, StreamParams(voice="serena", greedy=True, forced_frames=5, extra=whole)),
    ]
    try:
        got = run_joining(model, streams, 20)
    finally:
        hook.remove()
    assert prefills == [16]  # the step where slots 2, 3, 4 joined
    for slot, _, text, params in streams:
        np.testing.assert_array_equal(
            got[slot], prefill_reference(model, slot, text, params), err_msg=f"slot {slot}"
        )


def test_cloned_voices_give_their_reference_codes(device: str) -> None:
    """x-vector and in-context voices (prompts with vectors: clone_prefill.py), alone and joining."""
    model = load_qwen3(None, "tiny-base", device=device, seed=4, max_slots=3, max_batch_size=3)
    cloner = VoiceCloner.random(model.cfg, seed=5, device=device)
    icl = cloner.profile(reference_audio(1.5, 24_000, seed=6), 24_000, "Hello world.")
    xvec = replace(icl, ref_codes=None, ref_text="")
    streams = [
        (0, 0, "A cloned voice.", StreamParams(greedy=True, forced_frames=6, extra={PROFILE_KEY: icl})),
        (1, 1, "Another.", StreamParams(greedy=False, forced_frames=5, seed=2, extra={PROFILE_KEY: xvec})),
        (
            2,
            1,
            "Whole text.",
            StreamParams(greedy=True, forced_frames=4, extra={PROFILE_KEY: icl, "whole_text": True}),
        ),
    ]
    got = run_joining(model, streams, 20)
    for slot, _, text, params in streams:
        np.testing.assert_array_equal(
            got[slot], prefill_reference(model, slot, text, params), err_msg=f"slot {slot}"
        )
