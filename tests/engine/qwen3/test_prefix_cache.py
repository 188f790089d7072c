"""Kept prompt heads (prefix_cache.py): a stream whose head is kept starts without a prefill and gives
the codes it gives with one, whatever the kept entries' history."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from voicewire.engine.model import StreamParams
from voicewire.engine.qwen3 import Qwen3TTSModel, ServeOptions, load_qwen3
from voicewire.engine.qwen3.voice_clone import PROFILE_KEY, VoiceCloner

from .conftest import run_joining, run_stream
from .oracle import reference_audio

# (slot, join at step, text, params): two heads (ryan / english, vivian), each more than once, one
# stream in the whole-text mode, whose prompt holds its text and is never kept
STREAMS = [
    (0, 0, "Hello world, this is a test.", StreamParams(voice="ryan", language="english", greedy=True, forced_frames=9)),
    (1, 0, "Another voice.", StreamParams(voice="vivian", greedy=False, forced_frames=7, seed=5)),
    (2, 2, "The same head as the first.", StreamParams(voice="ryan", language="english", greedy=True, forced_frames=6)),
    (3, 2, "Sampled, the second head.", StreamParams(voice="vivian", greedy=False, forced_frames=8, seed=77)),
    (4, 3, "Whole.", StreamParams(voice="ryan", language="english", greedy=True, forced_frames=5, extra={"whole_text": True})),
    (5, 5, "Late, the first head again.", StreamParams(voice="ryan", language="english", greedy=True, forced_frames=4)),
]


def _model(device: str, entries: int) -> Qwen3TTSModel:
    options = ServeOptions(max_slots=6, max_batch_size=6, max_seq_len=256, prefix_cache=entries)
    return load_qwen3(None, "tiny", device=device, seed=3, options=options)


@pytest.fixture(scope="module")
def prefilled(device: str) -> dict[int, np.ndarray]:
    """Every stream's codes with no head kept: each one prefilled."""
    model = _model(device, 0)
    got = run_joining(model, STREAMS, 40)
    assert model.prefixes.hits == 0
    return got


@pytest.mark.parametrize("entries", [32, 1])
def test_streams_of_a_kept_head_give_the_codes_of_a_prefill(
    device: str, prefilled: dict[int, np.ndarray], entries: int
) -> None:
    """With room for every head, and with room for one: the two heads then take the one entry in
    turn (a step attaches a stream to the entry before a prefill in it takes the entry over)."""
    model = _model(device, entries)
    got = run_joining(model, STREAMS, 40)
    for slot in prefilled:
        np.testing.assert_array_equal(got[slot], prefilled[slot], err_msg=f"slot {slot}")
    # slots 2, 3 and 5 repeat a head. With one entry, step 0 leaves vivian's head in it (prefilled
    # after ryan's); step 2 attaches slot 3 to it while slot 2's prefill takes it over for ryan's,
    # which slot 5 then finds
    assert model.prefixes.hits == (3 if entries > 1 else 2)


def test_a_kept_head_outlives_the_stream_it_came_from(device: str, prefilled: dict[int, np.ndarray]) -> None:
    """The first stream's slot closes and its blocks go to later streams; the kept head is apart from
    the pool, so a stream opened after that still gets the prefilled stream's codes."""
    model = _model(device, 32)
    slot, _, text, params = STREAMS[0]
    first = run_stream(model, slot, [text], params)
    for other in (1, 2, 3):  # the freed blocks written over by other streams
        run_stream(model, other, ["Something else entirely, to fill the blocks."], StreamParams(greedy=True, forced_frames=12))
    again = run_stream(model, 4, [text], params)
    np.testing.assert_array_equal(first, prefilled[slot])
    np.testing.assert_array_equal(again, first)
    # attached: the second and third of the default voice's streams (the first kept its head), and again
    assert model.prefixes.hits == 3


def test_a_voice_cloned_from_an_x_vector_keeps_its_head_under_its_vector(device: str) -> None:
    """An x-vector voice's head holds the vector: its streams attach to it, a stream of another
    vector does not, and in-context voices (whose prompts end in the reference) are never kept."""
    cloner = None
    runs, hits = {}, 0
    for entries in (0, 32):
        options = ServeOptions(max_slots=3, max_batch_size=3, prefix_cache=entries)
        model = load_qwen3(None, "tiny-base", device=device, seed=4, options=options)
        cloner = cloner or VoiceCloner.random(model.cfg, seed=5, device=device)
        icl = cloner.profile(reference_audio(1.5, 24_000, seed=6), 24_000, "Hello world.")
        xvec = replace(icl, ref_codes=None, ref_text="")
        other = replace(xvec, speaker_embedding=xvec.speaker_embedding.flip(0))
        streams = [
            (0, 0, "A cloned voice.", StreamParams(greedy=True, forced_frames=5, extra={PROFILE_KEY: xvec})),
            (1, 0, "In context.", StreamParams(greedy=True, forced_frames=4, extra={PROFILE_KEY: icl})),
            (2, 1, "Another vector.", StreamParams(greedy=True, forced_frames=4, extra={PROFILE_KEY: other})),
            (1, 6, "The first vector again.", StreamParams(greedy=False, seed=3, forced_frames=5, extra={PROFILE_KEY: xvec})),
            (0, 7, "In context again.", StreamParams(greedy=True, forced_frames=4, extra={PROFILE_KEY: icl})),
        ]
        # one slot per stream at a time: a slot is reused once its first stream has ended
        runs[entries] = [run_joining(model, streams[:3], 20), run_joining(model, streams[3:], 20)]
        hits = model.prefixes.hits
    for kept, prefilled in zip(runs[32], runs[0], strict=True):
        for slot in prefilled:
            np.testing.assert_array_equal(kept[slot], prefilled[slot], err_msg=f"slot {slot}")
    assert hits == 1  # the first vector's second stream
