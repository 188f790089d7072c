"""Streaming sliding-window attention against its references: one chunk against the chunk reference (output
and ring), many chunks against the whole-sequence offline attention, the 72/73 window edge, padding,
ring capacities, strided layouts, bad inputs; big batches and CUDA graphs on the GPU.

The kernel lives in benchmarks/sliding_window/: measured, not yet wired into the codec decoder."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from benchmarks.sliding_window.reference import (
    sliding_window_attention_offline_ref,
    sliding_window_attention_ref,
)
from benchmarks.sliding_window.sliding_window_attention import (
    CODEC_WINDOW,
    MAX_CHUNK_FRAMES,
    sliding_window_attention,
)
from tests.kernels.common import REL_TOL, needs_interpreter, rel_err, skip_unsupported

# The codec decoder's attention: 16 heads x 64, MHA. Tests that loop over many chunks use 2 heads to keep
# the CPU interpreter fast; the heads are independent programs.
HEADS, HEAD_DIM = 16, 64
ALL_DTYPES = [torch.float32, torch.float16, torch.bfloat16]
DTYPE_IDS = ["fp32", "fp16", "bf16"]


def make_rings(
    num_slots: int, heads: int, capacity: int, positions: dict[int, int], dtype: torch.dtype, device: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rings whose entries a stream has written (min(pos, C) of them) are random; every other entry is
    NaN, so a read of a never-written entry shows up in the output."""
    k = torch.full((num_slots, heads, capacity, HEAD_DIM), float("nan"), dtype=dtype, device=device)
    v = torch.full_like(k, float("nan"))
    for slot, pos in positions.items():
        written = torch.arange(max(0, pos - capacity), pos) % capacity
        k[slot][:, written] = torch.randn(heads, len(written), HEAD_DIM, dtype=dtype, device=device)
        v[slot][:, written] = torch.randn(heads, len(written), HEAD_DIM, dtype=dtype, device=device)
    return k, v


def assert_same_ring(ring: torch.Tensor, ref_ring: torch.Tensor) -> None:
    torch.testing.assert_close(ring, ref_ring, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("chunk", [1, 5, 32])
def test_chunk_matches_reference_and_updates_ring(device: str, dtype: torch.dtype, chunk: int) -> None:
    skip_unsupported(device, dtype)
    torch.manual_seed(chunk)
    # New stream, short history, exactly window - 1 and window frames, window + 1, long history.
    positions = [0, 3, 71, 72, 73, 200]
    slot_idx = [7, 0, 3, 2, 5, 1]  # scattered; slots 4, 6, 8 unused (NaN)
    batch = len(positions)
    q, k_new, v_new = (
        torch.randn(batch, HEADS, chunk, HEAD_DIM, dtype=dtype, device=device) for _ in range(3)
    )
    k_ring, v_ring = make_rings(
        9, HEADS, CODEC_WINDOW, dict(zip(slot_idx, positions, strict=True)), dtype, device
    )
    k_ref, v_ref = k_ring.clone(), v_ring.clone()
    slots = torch.tensor(slot_idx, dtype=torch.int32, device=device)
    pos = torch.tensor(positions, dtype=torch.int32, device=device)
    out = torch.full_like(q, float("nan"))
    sliding_window_attention(
        q, k_new, v_new, k_ring, v_ring, slots, pos, scale=0.125, out=out, check_bounds=True
    )
    ref = sliding_window_attention_ref(
        q, k_new, v_new, k_ref, v_ref, slots, pos, window=CODEC_WINDOW, scale=0.125
    )
    assert rel_err(out, ref) < REL_TOL[dtype]
    assert_same_ring(k_ring, k_ref)
    assert_same_ring(v_ring, v_ref)


def stream_through_rings(
    device: str,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    totals: list[int],
    chunk_plan: list[int],
    *,
    window: int,
    capacity: int,
) -> torch.Tensor:
    """Feed whole sequences (B, H, N, D) chunk by chunk, as the engine would: per call every stream that
    still has frames gets up to the call's T (its real count in chunk_lengths), the rest pad."""
    batch, heads, _, _ = q.shape
    k_ring = torch.full((batch + 1, heads, capacity, HEAD_DIM), float("nan"), device=device)
    v_ring = torch.full_like(k_ring, float("nan"))
    slots = torch.arange(batch, 0, -1, dtype=torch.int32, device=device)  # slot 0 unused
    out = torch.full_like(q, float("nan"))
    done = [0] * batch
    call = 0
    while any(d < n for d, n in zip(done, totals, strict=True)):
        chunk = chunk_plan[call % len(chunk_plan)]
        call += 1
        real = [min(chunk, n - d) for d, n in zip(done, totals, strict=True)]
        q_c, k_c, v_c = (torch.zeros(batch, heads, chunk, HEAD_DIM, device=device) for _ in range(3))
        for b in range(batch):
            sl = slice(done[b], done[b] + real[b])
            q_c[b, :, : real[b]], k_c[b, :, : real[b]], v_c[b, :, : real[b]] = (
                q[b, :, sl],
                k[b, :, sl],
                v[b, :, sl],
            )
        pos = torch.tensor(done, dtype=torch.int32, device=device)
        lens = torch.tensor(real, dtype=torch.int32, device=device)
        o = sliding_window_attention(
            q_c, k_c, v_c, k_ring, v_ring, slots, pos, scale=0.125, window=window, chunk_lengths=lens
        )
        for b in range(batch):
            out[b, :, done[b] : done[b] + real[b]] = o[b, :, : real[b]]
            assert torch.equal(o[b, :, real[b] :], torch.zeros_like(o[b, :, real[b] :]))  # padding zeros
            done[b] += real[b]
    return out


@pytest.mark.parametrize(
    ("window", "capacity", "chunk_plan"),
    [
        (CODEC_WINDOW, CODEC_WINDOW, [1, 2, 5, 32, 3]),  # the codec: first chunks small, then bigger
        (CODEC_WINDOW, CODEC_WINDOW - 1, [7]),  # the smallest ring that holds a window's past
        (8, 12, [1, 3, 16]),  # chunks longer than the window and the ring: only the last C frames kept
    ],
)
def test_streaming_equals_offline(device: str, window: int, capacity: int, chunk_plan: list[int]) -> None:
    torch.manual_seed(window + capacity)
    totals = [150, 90, 73]  # streams end at different frames; 73 crosses the 72/73 edge once
    heads, frames = 2, max(totals)
    q, k, v = (torch.randn(len(totals), heads, frames, HEAD_DIM, device=device) for _ in range(3))
    streamed = stream_through_rings(device, q, k, v, totals, chunk_plan, window=window, capacity=capacity)
    offline = sliding_window_attention_offline_ref(q, k, v, window=window, scale=0.125)
    for b, n in enumerate(totals):
        assert rel_err(streamed[b, :, :n], offline[b, :, :n]) < REL_TOL[torch.float32], b


@pytest.mark.parametrize(("position", "sees_frame_0"), [(71, True), (72, False)])
def test_window_edge_72_73(device: str, position: int, sees_frame_0: bool) -> None:
    # One query at frame `position`; frame 0's value is 1000 and its score dominates, so the output shows
    # directly whether frame 0 is inside the window: frame 71 sees 72 frames (0..71), frame 72 does not.
    heads, capacity = 1, CODEC_WINDOW
    k_ring = torch.zeros(1, heads, capacity, HEAD_DIM, device=device)
    v_ring = torch.zeros_like(k_ring)
    k_ring[0, :, 0, 0] = 50.0  # frame 0 lives at ring index 0 % 72
    v_ring[0, :, 0, :] = 1000.0
    q = torch.zeros(1, heads, 1, HEAD_DIM, device=device)
    q[..., 0] = 1.0
    k_new, v_new = torch.zeros_like(q), torch.zeros_like(q)
    slots = torch.zeros(1, dtype=torch.int32, device=device)
    pos = torch.full((1,), position, dtype=torch.int32, device=device)
    out = sliding_window_attention(q, k_new, v_new, k_ring, v_ring, slots, pos, scale=1.0, update_cache=False)
    assert (out[0, 0, 0, 0].item() > 900.0) == sees_frame_0


def test_update_cache_false_and_padding_rows_leave_rings(device: str) -> None:
    torch.manual_seed(1)
    batch, chunk = 2, 4
    q, k_new, v_new = (torch.randn(batch, HEADS, chunk, HEAD_DIM, device=device) for _ in range(3))
    k_ring, v_ring = make_rings(2, HEADS, CODEC_WINDOW, {0: 80, 1: 10}, torch.float32, device)
    before = k_ring.clone(), v_ring.clone()
    slots = torch.tensor([0, 1], dtype=torch.int32, device=device)
    pos = torch.tensor([80, 10], dtype=torch.int32, device=device)
    sliding_window_attention(q, k_new, v_new, k_ring, v_ring, slots, pos, scale=0.125, update_cache=False)
    assert_same_ring(k_ring, before[0])
    assert_same_ring(v_ring, before[1])
    # Row 1 is a padding row (0 real frames): zeros out, its ring untouched; row 0 appends as usual.
    lens = torch.tensor([chunk, 0], dtype=torch.int32, device=device)
    out = sliding_window_attention(
        q, k_new, v_new, k_ring, v_ring, slots, pos, scale=0.125, chunk_lengths=lens, check_bounds=True
    )
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    assert_same_ring(k_ring[1], before[0][1])
    assert not torch.equal(k_ring[0].nan_to_num(), before[0][0].nan_to_num())


def test_bthd_layout_views(device: str) -> None:
    # The decoder's projections come out as (B, T, H, D); the kernel takes the transposed views as they are
    # and writes out with the same strides.
    torch.manual_seed(2)
    batch, chunk = 3, 6
    q, k_new, v_new = (
        torch.randn(batch, chunk, HEADS, HEAD_DIM, device=device).transpose(1, 2) for _ in range(3)
    )
    positions = {0: 5, 1: 100, 2: 0}
    k_ring, v_ring = make_rings(3, HEADS, CODEC_WINDOW, positions, torch.float32, device)
    k_ref, v_ref = k_ring.clone(), v_ring.clone()
    slots = torch.tensor([0, 1, 2], dtype=torch.int32, device=device)
    pos = torch.tensor(list(positions.values()), dtype=torch.int32, device=device)
    out = sliding_window_attention(q, k_new, v_new, k_ring, v_ring, slots, pos, scale=0.125)
    assert out.stride() == q.stride()
    ref = sliding_window_attention_ref(
        q, k_new, v_new, k_ref, v_ref, slots, pos, window=CODEC_WINDOW, scale=0.125
    )
    assert rel_err(out, ref) < REL_TOL[torch.float32]
    assert_same_ring(k_ring, k_ref)


@needs_interpreter  # CPU tensors: on a CUDA machine the device check would speak first
def test_rejects_bad_inputs() -> None:
    q = torch.randn(2, HEADS, 3, HEAD_DIM)
    ring = torch.zeros(2, HEADS, CODEC_WINDOW, HEAD_DIM)
    slots = torch.tensor([0, 1], dtype=torch.int32)
    pos = torch.tensor([0, 5], dtype=torch.int32)
    with pytest.raises(ValueError, match="ring capacity"):
        sliding_window_attention(q, q, q, ring[:, :, :70], ring[:, :, :70], slots, pos, scale=0.1)
    with pytest.raises(ValueError, match="chunk frames"):
        big = torch.zeros(2, HEADS, MAX_CHUNK_FRAMES + 1, HEAD_DIM)
        sliding_window_attention(big, big, big, ring, ring, slots, pos, scale=0.1)
    with pytest.raises(TypeError, match="positions must be int32"):
        sliding_window_attention(q, q, q, ring, ring, slots, pos.long(), scale=0.1)
    with pytest.raises(TypeError, match="dtype"):
        sliding_window_attention(q, q.half(), q, ring, ring, slots, pos, scale=0.1)
    with pytest.raises(ValueError, match="heads/head_dim"):
        sliding_window_attention(q, q, q, ring[:, :8], ring[:, :8], slots, pos, scale=0.1)
    with pytest.raises(ValueError, match="distinct"):
        sliding_window_attention(q, q, q, ring, ring, slots * 0, pos, scale=0.1, check_bounds=True)
    padding = torch.tensor([3, 0], dtype=torch.int32)  # row 1 pads and shares slot 0: allowed
    sliding_window_attention(
        q, q, q, ring, ring, slots * 0, pos, scale=0.1, chunk_lengths=padding, check_bounds=True
    )
    with pytest.raises(ValueError, match="chunk_lengths"):
        lens = torch.tensor([3, 4], dtype=torch.int32)
        sliding_window_attention(
            q, q, q, ring, ring, slots, pos, scale=0.1, chunk_lengths=lens, check_bounds=True
        )


@pytest.mark.gpu
@pytest.mark.parametrize("chunk", [1, 4, 25])
def test_codec_batch_bf16(chunk: int) -> None:
    torch.manual_seed(chunk)
    batch = 64
    positions = torch.randint(0, 400, (batch,)).tolist()
    slot_idx = torch.randperm(batch + 5)[:batch].tolist()
    q, k_new, v_new = (
        torch.randn(batch, HEADS, chunk, HEAD_DIM, dtype=torch.bfloat16, device="cuda") for _ in range(3)
    )
    k_ring, v_ring = make_rings(
        batch + 5, HEADS, CODEC_WINDOW, dict(zip(slot_idx, positions, strict=True)), torch.bfloat16, "cuda"
    )
    k_ref, v_ref = k_ring.clone(), v_ring.clone()
    slots = torch.tensor(slot_idx, dtype=torch.int32, device="cuda")
    pos = torch.tensor(positions, dtype=torch.int32, device="cuda")
    out = sliding_window_attention(
        q, k_new, v_new, k_ring, v_ring, slots, pos, scale=0.125, check_bounds=True
    )
    ref = sliding_window_attention_ref(
        q, k_new, v_new, k_ref, v_ref, slots, pos, window=CODEC_WINDOW, scale=0.125
    )
    assert rel_err(out, ref) < REL_TOL[torch.bfloat16]
    assert_same_ring(k_ring, k_ref)
    assert_same_ring(v_ring, v_ref)


@pytest.mark.gpu
def test_cuda_graph_replay_streams_forward() -> None:
    # Graph per (streams, frames) bucket: replays advance positions in the device tensor; the result must
    # equal the offline attention over the concatenated chunks.
    torch.manual_seed(3)
    batch, chunk, calls = 4, 3, 40
    frames = chunk * calls
    q, k, v = (torch.randn(batch, HEADS, frames, HEAD_DIM, device="cuda") for _ in range(3))
    k_ring = torch.full((batch, HEADS, CODEC_WINDOW, HEAD_DIM), float("nan"), device="cuda")
    v_ring = torch.full_like(k_ring, float("nan"))
    slots = torch.arange(batch, dtype=torch.int32, device="cuda")
    pos = torch.zeros(batch, dtype=torch.int32, device="cuda")
    q_c, k_c, v_c = (torch.empty(batch, HEADS, chunk, HEAD_DIM, device="cuda") for _ in range(3))
    out_c = torch.empty_like(q_c)

    def step() -> None:
        sliding_window_attention(q_c, k_c, v_c, k_ring, v_ring, slots, pos, scale=0.125, out=out_c)

    for buf, src in ((q_c, q), (k_c, k), (v_c, v)):
        buf.copy_(src[:, :, :chunk])
    step()  # compile (and the first chunk) outside the capture
    pos += chunk
    first = out_c.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    outs = [first]
    for call in range(1, calls):
        sl = slice(call * chunk, (call + 1) * chunk)
        for buf, src in ((q_c, q), (k_c, k), (v_c, v)):
            buf.copy_(src[:, :, sl])
        graph.replay()
        pos += chunk
        outs.append(out_c.clone())
    offline = sliding_window_attention_offline_ref(q, k, v, window=CODEC_WINDOW, scale=0.125)
    assert rel_err(torch.cat(outs, dim=2), offline) < 1e-4  # fp32 in, IEEE dots
