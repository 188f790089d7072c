"""How a tick's due codec chunks are split into codec calls (host-side planning, no torch).

One call runs its rows padded to a common frame count: the smallest graphed count that fits the
longest chunk (a chunk longer than every graph runs eagerly at its own length). Padding is not free:
a lone 12-frame chunk next to fifteen 1-frame first chunks makes them all pay for 12 frames, while
similar sizes are cheaper together than apart. A call costs about CODEC_CALL_MS, plus CODEC_ROW_MS
per bucket row and CODEC_FRAME_MS per padded frame (bucket rows x frames); chunks of one padded
size always share calls, so the choice is where to cut the few (<= 7) size classes: a DP over them,
microseconds of host time per tick. The rows of a group of classes go into calls of bucket sizes
chosen the same way: 20 rows of 12 frames run as calls of 16 and 4 rows (~6.9 ms) rather than one of
32 with 12 padding rows (~8.4 ms); the best split of n rows at T frames depends on (T, n) alone and
is kept once found.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Sequence

_Splits = list[tuple[float, int]]  # per row count n: (least estimated ms, rows of its first call)
_splits: dict[tuple[int, tuple[int, ...]], _Splits] = {}

# Estimated codec call time on the H200 (bf16, graphs): a least-squares fit of
# benchmarks/results/codec_bench_h200.json [after.calls], 1-64 rows x 1-48 frames, within 10% everywhere
# (1 x 1: 1.03 ms, 16 x 12: 4.88, 64 x 48: 55.8): a call costs as much as ~60 padded frames. Only
# used to choose how to split a tick.
CODEC_CALL_MS = 1.08
CODEC_ROW_MS = 0.016
CODEC_FRAME_MS = 0.0175


def padded_frames(n_frames: int, graphed: Sequence[int]) -> int:
    """The frame count a chunk of ``n_frames`` runs at: the smallest graphed one that fits, else its own."""
    return next((t for t in graphed if t >= n_frames), n_frames)


def plan_codec_calls(
    frames_desc: Sequence[int], graphed: Sequence[int], buckets: Sequence[int]
) -> list[list[int]]:
    """Chunk frame counts (longest first) -> the codec calls of least estimated time, as lists of
    positions in ``frames_desc``; no call holds more rows than the largest batch bucket."""
    classes: list[tuple[int, int]] = []  # (padded frames, chunks), longest first
    padded: dict[int, int] = {}  # chunk sizes repeat (1, 2, 4, 8, 12): each looked up once
    for f in frames_desc:
        t = padded.get(f)
        if t is None:
            t = padded[f] = padded_frames(f, graphed)
        if classes and classes[-1][0] == t:
            classes[-1] = (t, classes[-1][1] + 1)
        else:
            classes.append((t, 1))

    def cost(t: int, rows: int) -> float:
        return _row_splits(t, buckets, rows)[rows][0]

    upto = list(itertools.accumulate((n for _, n in classes), initial=0))  # chunks in classes [0, i)
    # best[i]: the cheapest split of classes [0, i) -> (estimated ms, the classes that start a call)
    best: list[tuple[float, list[int]]] = [(0.0, [])]
    for i in range(1, len(classes) + 1):
        options = []
        for j in range(i):  # classes [j, i) share calls, padded to class j's frame count
            options.append((best[j][0] + cost(classes[j][0], upto[i] - upto[j]), j))
        ms, j = min(options, key=operator.itemgetter(0))
        best.append((ms, [*best[j][1], j]))
    starts = [upto[c] for c in [*best[-1][1], len(classes)]]
    groups: list[list[int]] = []
    for c, (a, b) in zip(best[-1][1], itertools.pairwise(starts), strict=True):
        splits = _row_splits(classes[c][0], buckets, b - a)
        while a < b:
            n = min(splits[b - a][1], b - a)
            groups.append(list(range(a, a + n)))
            a += n
    return groups


def _row_splits(t: int, buckets: Sequence[int], rows: int) -> _Splits:
    """The cheapest calls for 0..``rows`` rows padded to ``t`` frames, grown as needed: a call of
    bucket b first, then the best for the rows left (the larger first call where costs tie, so the
    calls come largest first)."""
    splits = _splits.setdefault((t, tuple(buckets)), [(0.0, 0)])
    per_row = CODEC_ROW_MS + CODEC_FRAME_MS * t
    for n in range(len(splits), rows + 1):
        options = ((CODEC_CALL_MS + per_row * b + splits[max(0, n - b)][0], b) for b in reversed(buckets))
        splits.append(min(options, key=operator.itemgetter(0)))
    return splits
