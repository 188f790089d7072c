"""The paged KV cache under the model (kv_cache.py, kv_pool.py): a stream on blocks another stream held
(in another order, never cleared) speaks exactly as on fresh memory; streams crossing page edges give
the codes of the slot-contiguous layout (one page per stream); a pool that runs out ends the stream
that cannot grow with an error and the others go on."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from voicewire.engine.model import DecodeWork, StreamParams
from voicewire.engine.qwen3 import ExperimentalOptions, Qwen3TTSModel, ServeOptions, load_qwen3
from voicewire.engine.qwen3.kv_pool import PAGE

from .conftest import run_joining

SENTENCE = "Hello world, this is a test."
LONG = " ".join(["word"] * 70)  # a whole-text prompt of 80 positions: two pages before the first frame
OPTIONS = ServeOptions(max_slots=4, max_batch_size=4, max_seq_len=256, cuda_graphs=False)


def fresh(device: str, **changes: object) -> Qwen3TTSModel:
    return load_qwen3(None, "tiny", device=device, seed=3, options=replace(OPTIONS, **changes))  # type: ignore[arg-type]


def speak(model: Qwen3TTSModel, slot: int, text: str, params: StreamParams) -> tuple[np.ndarray, np.ndarray]:
    """One stream alone to its end -> codes (T, 16) and its PCM (one final chunk); the slot stays open."""
    model.open_slot(slot, params)
    model.add_text(slot, [text], True)
    frames = []
    while model.ready(slot):
        r = model.generate([slot])[0]
        assert r.error is None, r.error
        if r.frames is not None:
            frames.append(r.frames)
        if r.finished:
            break
    pcm = model.decode([DecodeWork(slot=slot, frames=frames, n_frames=len(frames), final=True)])[0]
    return np.concatenate(frames), pcm


def owned(model: Qwen3TTSModel, slot: int) -> list[int]:
    pool = model.kv.pool
    return pool.table[slot, : pool.owned(slot)].tolist()


def test_a_stream_on_reused_blocks_speaks_as_on_fresh_memory(device: str) -> None:
    b_params = StreamParams(voice="vivian", greedy=False, forced_frames=90, seed=5)  # ~100 positions
    want_codes, want_pcm = speak(fresh(device), 1, SENTENCE, b_params)

    model = fresh(device)
    speak(
        model, 0, LONG, StreamParams(voice="ryan", greedy=True, forced_frames=60, extra={"whole_text": True})
    )
    a_blocks = owned(model, 0)
    assert len(a_blocks) == 3  # 80 + 60 positions
    model.close_slot(0)
    # A's blocks handed out next in another order (B's first page is A's third, its second A's first),
    # and every cached value made stale junk (finite: the SDPA path multiplies masked-out values by 0)
    pool = model.kv.pool
    pool._free = [b for b in pool._free if b not in a_blocks] + [a_blocks[1], a_blocks[0], a_blocks[2]]
    gen = torch.Generator().manual_seed(0)
    for cache in (model.kv.k, model.kv.v):
        cache.copy_(torch.randn(cache.shape, generator=gen).to(cache) * 100)
    got_codes, got_pcm = speak(model, 1, SENTENCE, b_params)
    assert owned(model, 1) == [a_blocks[2], a_blocks[0]]
    np.testing.assert_array_equal(got_codes, want_codes)
    np.testing.assert_array_equal(got_pcm, want_pcm)
    model.close_slot(1)
    assert model.kv.pool.free_blocks == model.kv.pool.usable_blocks


def test_streams_across_page_edges_give_the_slot_contiguous_codes(device: str) -> None:
    """Streams joining and leaving a shared batch, over 1 to 3 pages each (a whole-text prompt that
    spans two before its first frame among them): the same codes as with one 256-position page per
    stream, the slot-contiguous layout."""
    whole = {"whole_text": True}
    streams = [
        (0, 0, SENTENCE, StreamParams(voice="ryan", greedy=True, forced_frames=70)),
        (1, 2, LONG, StreamParams(voice="eric", greedy=True, forced_frames=60, extra=whole)),
        (2, 5, "The quick brown fox.", StreamParams(voice="vivian", greedy=False, forced_frames=20, seed=7)),
        (3, 30, "Late.", StreamParams(voice="aiden", greedy=False, forced_frames=130, seed=99)),
    ]
    paged = fresh(device)
    contiguous = fresh(device, experimental=ExperimentalOptions(kv_page=OPTIONS.max_seq_len))
    assert paged.kv.page == PAGE and contiguous.kv.max_blocks == 1
    got, want = run_joining(paged, streams, 200), run_joining(contiguous, streams, 200)
    for slot, *_ in streams:
        np.testing.assert_array_equal(got[slot], want[slot], err_msg=f"slot {slot}")
    assert paged.kv.pool.free_blocks == paged.kv.pool.usable_blocks  # every block back


def test_a_full_pool_ends_the_stream_that_cannot_grow_and_the_others_go_on(device: str) -> None:
    """5 blocks; each stream takes 2 at its open (kv_cache.py ``open``). A (a whole-text prompt of 80
    positions, 150 frames) takes the last free one at position 128 and finds none at 192: it ends with
    an error there, and B (a streamed prompt, 130 frames), which needs its third block at 128 only after
    A has given its back, speaks to its end."""
    a_params = StreamParams(voice="ryan", greedy=True, forced_frames=150, extra={"whole_text": True})
    b_params = StreamParams(voice="vivian", greedy=True, forced_frames=130)
    alone = fresh(device)
    a_alone, _ = speak(alone, 0, LONG, a_params)
    alone.close_slot(0)
    b_alone, _ = speak(alone, 1, SENTENCE, b_params)

    model = fresh(device, kv_blocks=6)
    room = model.kv_room()
    assert (room.free_blocks, room.total_blocks, room.block_positions) == (5, 5, PAGE)
    assert room.new_stream_blocks == 2
    for slot, text, params in ((0, LONG, a_params), (1, SENTENCE, b_params)):
        model.open_slot(slot, params)
        model.add_text(slot, [text], True)
    n = len(model._prompt(model._slots[0]))
    got: dict[int, list[np.ndarray]] = {0: [], 1: []}
    errors: dict[int, str] = {}
    live = [0, 1]
    for _ in range(300):
        if not live:
            break
        for r in model.generate([s for s in live if model.ready(s)]):
            if r.frames is not None:
                got[r.slot].append(r.frames)
            if r.error is not None:
                errors[r.slot] = r.error
            if r.finished:
                live.remove(r.slot)
                model.close_slot(r.slot)
    assert list(errors) == [0] and "KV cache full" in errors[0]
    a = np.concatenate(got[0])
    assert len(a) == 3 * PAGE + 1 - n  # A stopped at its third page's end: positions n - 1 .. 191 fed
    np.testing.assert_array_equal(a, a_alone[: len(a)])  # what it spoke was its own
    np.testing.assert_array_equal(np.concatenate(got[1]), b_alone)  # B was untouched
    assert model.kv_room().free_blocks == 5


def test_page_sizes_that_split_a_tile_are_refused() -> None:
    with pytest.raises(ValueError, match="kv_page"):
        replace(OPTIONS, experimental=ExperimentalOptions(kv_page=96))
    assert replace(OPTIONS, experimental=ExperimentalOptions(kv_page=128)).pool_blocks == 1 + 4 * 2
    assert OPTIONS.pool_blocks == 1 + 4 * 4  # the default pool: a full row for every slot
