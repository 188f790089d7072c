"""Ragged codec calls: rows padded to a common frame count T, each with its own valid frames n_b.

A row of a ragged call must give what decoding its n_b frames alone gives: the same PCM, the same
next state and position, so the chunks after it match too; and ``Model.decode`` makes one codec call
per tick whatever the chunk sizes.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest
import torch
from torch import Tensor

from voicewire.engine.model import DecodeWork, StreamParams
from voicewire.engine.qwen3 import Qwen3TTSModel, ServeOptions, codec_runner, load_qwen3
from voicewire.engine.qwen3.codec_decoder import CodecDecoder
from voicewire.engine.qwen3.codec_plan import padded_frames, plan_codec_calls
from voicewire.engine.qwen3.codec_runner import SPLIT_ROWS

STREAM_TOL = 1e-5  # fp32
FRAME_SAMPLES = 1920


def _codes(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 2048, size=(n, 16), dtype=np.int64)


def _offline(model: Qwen3TTSModel, codes: np.ndarray) -> np.ndarray:
    return model.codec.decode(torch.from_numpy(codes).T[None].to(model.device))[0].cpu().numpy()


def _padded(chunks: list[np.ndarray], t: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Chunks (n_b, 16) -> codes (B, 16, T) padded with code 0, n_valid (B,)."""
    codes = np.zeros((len(chunks), 16, t), np.int64)
    for r, c in enumerate(chunks):
        codes[r, :, : len(c)] = c.T
    n_valid = torch.tensor([len(c) for c in chunks], dtype=torch.int64, device=device)
    return torch.from_numpy(codes).to(device), n_valid


def _solo(codec: CodecDecoder, chunk: np.ndarray, state: Tensor, start: Tensor) -> tuple[Tensor, ...]:
    """One row's exact-length decode from its state (B = 1, no n_valid)."""
    codes = torch.from_numpy(chunk.T[None].copy()).to(state.device)
    return codec.stream(codes, state[None], start[None])


def test_ragged_rows_equal_their_exact_length_decodes(tiny: Qwen3TTSModel) -> None:
    codec, dev = tiny.codec, tiny.device
    # rows at different positions (0, 3, 68 frames decoded: the last crosses the 72-frame window)
    # with different valid counts, including 1 and T
    t, before, n = 8, (0, 3, 68, 10), (1, 8, 5, 3)
    streams = [_codes(20 + r, before[r] + 2 * t) for r in range(4)]
    state, start = codec.fresh_state(4)
    for r, k in enumerate(before):
        if k:
            _, s, p = _solo(codec, streams[r][:k], state[r], start[r])
            state[r], start[r] = s[0], p[0]
    codes, n_valid = _padded([streams[r][before[r] : before[r] + n[r]] for r in range(4)], t, dev)
    pcm, next_state, next_start = codec.stream(codes, state, start, n_valid)
    assert pcm.shape == (4, t * FRAME_SAMPLES)
    for r in range(4):
        chunk = streams[r][before[r] : before[r] + n[r]]
        solo_pcm, solo_state, solo_start = _solo(codec, chunk, state[r], start[r])
        torch.testing.assert_close(
            pcm[r, : n[r] * FRAME_SAMPLES], solo_pcm[0], rtol=0, atol=STREAM_TOL, msg=f"row {r} pcm"
        )
        assert float(solo_state.abs().max()) > 1e-3  # a state worth comparing
        torch.testing.assert_close(
            next_state[r], solo_state[0], rtol=1e-5, atol=STREAM_TOL, msg=f"row {r} state"
        )
        assert int(next_start[r]) == int(solo_start[0]) == before[r] + n[r]
    # the next (again ragged) chunk from that state: what the row alone gives next
    n2 = (t, 2, 1, 7)
    chunks2 = [streams[r][before[r] + n[r] : before[r] + n[r] + n2[r]] for r in range(4)]
    codes2, n_valid2 = _padded(chunks2, t, dev)
    pcm2, _, start2 = codec.stream(codes2, next_state, next_start, n_valid2)
    for r in range(4):
        offline = _offline(tiny, streams[r][: before[r] + n[r] + n2[r]])[before[r] * FRAME_SAMPLES :]
        got = torch.cat((pcm[r, : n[r] * FRAME_SAMPLES], pcm2[r, : n2[r] * FRAME_SAMPLES]))
        np.testing.assert_allclose(got.cpu().numpy(), offline, rtol=0, atol=STREAM_TOL, err_msg=f"row {r}")
        assert int(start2[r]) == before[r] + n[r] + n2[r]


def test_streaming_through_ragged_calls_equals_offline(tiny: Qwen3TTSModel) -> None:
    """Three utterances of 90 frames, every tick a ragged call of random counts 1..T per row."""
    codec, dev, t, total = tiny.codec, tiny.device, 12, 90
    streams = [_codes(30 + r, total) for r in range(3)]
    rng = np.random.default_rng(0)
    state, start = codec.fresh_state(3)
    done, pieces = [0, 0, 0], [[], [], []]
    while min(done) < total:
        n = [min(int(rng.integers(1, t + 1)), total - d) for d in done]
        # a finished row rides along with 0 valid frames: its state and position must not move
        codes, n_valid = _padded([s[d : d + k] for s, d, k in zip(streams, done, n, strict=True)], t, dev)
        pcm, state, start = codec.stream(codes, state, start, n_valid)
        for r in range(3):
            pieces[r].append(pcm[r, : n[r] * FRAME_SAMPLES].cpu().numpy())
            done[r] += n[r]
        assert start.tolist() == done
    for r in range(3):
        offline = _offline(tiny, streams[r])
        assert offline.std() > 1e-3
        np.testing.assert_allclose(np.concatenate(pieces[r]), offline, rtol=0, atol=STREAM_TOL)


@contextmanager
def _count_codec_calls(model: Qwen3TTSModel) -> Iterator[list[int]]:
    """Frame count T of every codec call (graph replay or eager) made inside the block."""
    calls: list[int] = []
    stream = model.codec.stream

    def counted(codes: Tensor, *args: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        calls.append(codes.shape[-1])
        return stream(codes, *args)

    model.codec.stream = counted  # type: ignore[method-assign]
    try:
        yield calls
    finally:
        del model.codec.stream


def _tick(model: Qwen3TTSModel, chunks: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
    work = [DecodeWork(slot, [c], len(c), False) for slot, c in chunks.items()]
    pcm = model.decode(work)
    for w, p in zip(work, pcm, strict=True):
        assert p.dtype == np.float32 and p.shape == (w.n_frames * FRAME_SAMPLES,)
    return {w.slot: p for w, p in zip(work, pcm, strict=True)}


def test_model_decodes_a_tick_of_mixed_chunk_sizes_in_few_calls(tiny: Qwen3TTSModel) -> None:
    for b in tiny.codec_runner.buckets:  # graphs for 5 frame counts (it was 12: every count 1..12)
        graphed = [t for t in range(1, 13) if tiny.graphs.has(("codec", b, t))]
        assert graphed == [1, 2, 4, 8, 12]
    # the last tick: 20 frames, past the CPU's graphs (eager), padded to 24 where CUDA has graphs to 48
    sizes = [(1, 2, 5, 12, 3), (12, 4, 1, 9, 8), (20, 1, 2, 3, 4)]
    t20 = padded_frames(20, tiny.codec_runner.frames)
    streams = {slot: _codes(40 + slot, sum(s[i] for s in sizes)) for i, slot in enumerate((0, 1, 2, 3, 5))}
    for slot in streams:
        tiny.open_slot(slot, StreamParams(greedy=True, seed=0))
    got: dict[int, list[np.ndarray]] = {slot: [] for slot in streams}
    done = dict.fromkeys(streams, 0)
    # the cost model's split (test below): a call costs ~80 padded frames, so five rows share a 12-frame
    # call, and only four short chunks beside a 20-frame one (24 on CUDA) are worth a call of their own
    for tick, expected_t in zip(sizes, ([12], [12], [t20, 4]), strict=True):
        chunks = {}
        for slot, n in zip(streams, tick, strict=True):
            chunks[slot] = streams[slot][done[slot] : done[slot] + n]
            done[slot] += n
        with _count_codec_calls(tiny) as calls:
            pcm = _tick(tiny, chunks)
        assert calls == expected_t, f"tick {tick}: codec calls of {calls} frames"
        for slot, p in pcm.items():
            got[slot].append(p)
        if tick == sizes[0]:  # the first chunk of each stream alone, from a fresh state
            for slot, c in chunks.items():
                np.testing.assert_allclose(pcm[slot], _offline(tiny, c), rtol=0, atol=STREAM_TOL)
    for slot, codes in streams.items():
        np.testing.assert_allclose(
            np.concatenate(got[slot]), _offline(tiny, codes), rtol=0, atol=STREAM_TOL, err_msg=f"slot {slot}"
        )
        tiny.close_slot(slot)


def test_more_chunks_than_the_largest_bucket_split_into_calls(device: str) -> None:
    opts = ServeOptions(max_slots=5, max_batch_size=5, max_seq_len=64, codec_batch_buckets=(1, 2))
    model = load_qwen3(None, "tiny", device=device, seed=3, options=opts)
    sizes = {0: 1, 1: 7, 2: 2, 3: 12, 4: 5}
    streams = {slot: _codes(50 + slot, n) for slot, n in sizes.items()}
    for slot in streams:
        model.open_slot(slot, StreamParams(greedy=True, seed=0))
    with _count_codec_calls(model) as calls:
        pcm = _tick(model, streams)
    # longest first, at most two rows a call
    assert calls == [12, 8, 2]  # (12), (7, 5), (2, 1)
    for slot, codes in streams.items():
        np.testing.assert_allclose(pcm[slot], _offline(model, codes), rtol=0, atol=STREAM_TOL)


def test_a_tick_splits_only_where_padding_costs_more_than_a_call() -> None:
    """Chunk sizes (longest first) -> codec calls (positions), with 16-row buckets."""

    def groups(frames: list[int]) -> list[list[int]]:
        return plan_codec_calls(frames, graphed=(1, 2, 4, 8, 12), buckets=(1, 2, 4, 8, 16))

    assert groups([12] * 16) == [list(range(16))]  # steady state: one call
    assert groups([1] * 6) == [list(range(6))]
    # one long chunk with fifteen first chunks: the 1-frame chunks must not pay for 12 frames
    assert groups([12] + [1] * 15) == [[0], list(range(1, 16))]
    # similar sizes share a call (the padding costs less than a call's ~1.1 ms)
    assert groups([12, 8, 1]) == [[0, 1, 2]]
    # past a full bucket the rest share one call: 7 rows padded to 12 frames cost less than two calls
    assert [len(g) for g in groups([12] * 20 + [1] * 3)] == [16, 7]
    assert [len(g) for g in groups([12] * 20 + [1] * 12)] == [16, 4, 12]
    # within the largest bucket too: 20 rows of 12 frames as 16 + 4 rather than 32 with 12 padding
    # rows; of 1 frame, where padding rows cost less than a call, as one call of 32
    wide = (1, 2, 4, 8, 16, 32)
    assert [len(g) for g in plan_codec_calls([12] * 20, (1, 2, 4, 8, 12), wide)] == [16, 4]
    assert [len(g) for g in plan_codec_calls([1] * 20, (1, 2, 4, 8, 12), wide)] == [20]


def test_full_rows_match_the_unragged_call(tiny: Qwen3TTSModel) -> None:
    """n_valid of T everywhere (the gather path) equals no n_valid (the plain tail slices)."""
    codec, t = tiny.codec, 4
    codes = torch.from_numpy(np.stack([_codes(60 + r, t).T for r in range(2)])).to(tiny.device)
    state, start = codec.fresh_state(2)
    ref = codec.stream(codes, state, start)
    full = torch.full((2,), t, dtype=torch.int64, device=tiny.device)
    out = codec.stream(codes, state, start, full)
    for a, b in zip(out, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_a_long_graph_in_parts_equals_one_call(tiny: Qwen3TTSModel, monkeypatch: pytest.MonkeyPatch) -> None:
    """A graph longer than ``LONGEST_CALL_FRAMES`` runs as calls of that many (cuDNN times no longer
    conv shapes): each row's valid PCM, next state and position equal one call's, whatever its count."""
    runner, t = tiny.codec_runner, 12
    n = (12, 7, 4, 1)  # all frames, a part and a bit, exactly one part, less than one
    rows = np.zeros((SPLIT_ROWS, 16 * t + 2), np.int64)  # a graph of fewer rows is not split
    rows[:, -1] = runner.pad_slot  # the rest are padding rows: 0 valid frames on the padding slot
    for r, k in enumerate(n):
        rows[r, : 16 * t] = _codes(80 + r, t).reshape(-1)
        rows[r, -2:] = k, r
    slots = torch.arange(len(n), device=tiny.device)
    results = []
    for longest in (t, 4):  # one call, then three of 4 frames from the same fresh states
        for s in range(len(n)):
            runner.open(s)
        runner.reset_opened()  # as the next decode_start does
        monkeypatch.setattr(codec_runner, "LONGEST_CALL_FRAMES", longest)
        pcm = runner.body(torch.from_numpy(rows).to(tiny.device))
        results.append((pcm, *runner.states.gather(slots)))
    (pcm1, state1, start1), (pcm3, state3, start3) = results
    for r, k in enumerate(n):
        torch.testing.assert_close(
            pcm3[r, : k * FRAME_SAMPLES], pcm1[r, : k * FRAME_SAMPLES], rtol=0, atol=STREAM_TOL
        )
    torch.testing.assert_close(state3, state1, rtol=1e-5, atol=STREAM_TOL)
    assert start3.tolist() == start1.tolist() == list(n)
    assert float(state1.abs().max()) > 1e-3  # states worth comparing


def test_codec_graphs_warm_on_threads_each_conv_shape_on_one() -> None:
    """Start-up spreads the codec graphs' warm-up (cuDNN timing their conv shapes) over threads:
    graphs whose convs run at the same shapes (the two lanes' graphs of one size, a split graph and
    its parts') share a thread, and the served set spreads evenly over every thread."""
    bulk = [(b, t) for b in (1, 2, 4, 8, 16, 32, 64) for t in (1, 2, 4, 8, 12, 24, 48)]
    urgent = [(b, t) for b in (1, 2, 4, 8, 16) for t in (1, 2, 4)]
    shapes = bulk + urgent
    lanes = codec_runner.warm_lanes(shapes, 4)
    lane_of_shape: dict[tuple[int, int], set[str]] = {}
    for s, lane in zip(shapes, lanes, strict=True):
        lane_of_shape.setdefault(codec_runner.conv_shapes(*s), set()).add(lane)
    assert all(len(v) == 1 for v in lane_of_shape.values()), lane_of_shape
    assert lanes[bulk.index((64, 48))] == lanes[bulk.index((64, 24))]  # a split graph times its parts' shapes
    assert lanes[len(bulk) + urgent.index((16, 4))] == lanes[bulk.index((16, 4))]
    assert (8, 48) in lane_of_shape  # fewer rows than SPLIT_ROWS: its own shapes
    per_lane = {lane: lanes.count(lane) for lane in set(lanes)}
    assert sorted(per_lane) == ["codec-0", "codec-1", "codec-2", "codec-3"]
    assert max(per_lane.values()) - min(per_lane.values()) <= 4, per_lane
    assert set(codec_runner.warm_lanes(shapes, 1)) == {"codec-0"}
