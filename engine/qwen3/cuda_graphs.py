"""CUDA graphs of the serving path: one captured body per (kind, bucket), typed static buffers.

A body is a function of one packed int64 input tensor (slots, prompts or codes; padding rows point at
the padding slot) that returns one output tensor, reading and writing only device tensors. Per key:

    static input (fixed shape)  --copy-->  captured body  -->  static output (fixed shape)

``run`` takes the host's rows, checks their shape against the key's buffer (a mismatch is a bug and
raises), copies them in (through the caller's pinned staging without waiting, host_staging.py),
replays, and returns the static output; the caller copies what it
needs before the next replay of the same key.

Graphs of one pool share its memory and are captured largest first, so a pool is sized by its largest
body (nano-vllm's habit): replays of one pool are sequential on one stream, so intermediates can share
memory. A body that replays on another stream at the same time as the others (the codec beside the
frame step) is registered in a pool of its own, and each pool is captured on a capture stream of its
own: torch keys cuBLAS's workspace by (handle, stream), so graphs captured on one stream write one
workspace, and two of them replayed at once on two streams would race on it (pytorch#193402; the
split-K and stream-K kernels keep partial sums and tile flags there).

Off CUDA (or with graphs disabled) the same static buffers feed the same body eagerly: the CPU tests
run exactly the code that is captured on the GPU.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch
from torch import Tensor

from .host_staging import Staging

Body = Callable[[Tensor], Tensor]
T = TypeVar("T")
log = logging.getLogger(__name__)
WARMUP_RUNS = 2  # eager runs before capture: Triton JIT, cuBLAS handles, torch.compile guards


@dataclass
class _Entry:
    body: Body
    input: Tensor  # static, int64
    output: Tensor | None = None  # static once captured (or after the first eager run)
    graph: torch.cuda.CUDAGraph | None = None
    pool: str = "main"
    priority: int = 0  # of the pool's capture stream
    kind: str = ""  # the key's first part ("decode", "prefill", a codec lane): start-up timing by kind
    warm_lane: str = "main"  # capture: lanes warm at the same time ("main" split over warm_threads)
    eager_s: float = 0.0  # its warm-up runs at capture (Triton JIT, torch.compile, cuDNN timing)


def _kind(key: Hashable) -> str:
    return str(key[0]) if isinstance(key, tuple) and key else str(key)


def bucket_for(n: int, buckets: Sequence[int]) -> int:
    """Smallest bucket >= n (buckets ascending)."""
    for b in buckets:
        if b >= n:
            return b
    raise ValueError(f"{n} rows exceed the largest graph bucket {buckets[-1]}")


def frame_ladder(limit: int) -> tuple[int, ...]:
    """Codec chunk lengths with a graph: 1, 2, 4, 8, then 12, 24, 48 ... and ``limit`` itself. The chunk
    schedule's sizes (engine/config.py ChunkSchedule) are on it, so a chunk pads only when it is a
    stream's last."""
    out = [n for n in (1, 2, 4, 8) if n < limit]
    n = 12
    while n < limit:
        out.append(n)
        n *= 2
    return (*out, limit)


def powers_of_two(limit: int) -> tuple[int, ...]:
    """1, 2, 4, ... and ``limit`` itself: the bucket sizes up to ``limit``."""
    out = [1]
    while out[-1] < limit:
        out.append(min(2 * out[-1], limit))
    return tuple(out)


def in_turns(
    lanes: Sequence[Sequence[T]],
    order: Sequence[T],
    warm: Callable[[list[T]], None],
    capture: Callable[[T], None],
    warmed: Callable[[], None] = lambda: None,
) -> None:
    """Each lane on a thread of its own (the first on the calling thread): ``warm`` its items, all
    lanes at once; once every lane has warmed, ``warmed()`` on one thread; then ``capture`` every item
    on its own lane's thread, one at a time, in ``order``, while the other threads wait (a CUDA graph
    capture must see no other thread's work). The first error stops every lane and is raised here."""
    owner = {id(item): k for k, lane in enumerate(lanes) for item in lane}
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(lanes), action=warmed)
    turn = threading.Condition()
    next_item = 0

    def my_turn_or_done(k: int) -> bool:
        return next_item >= len(order) or owner[id(order[next_item])] == k

    def run(k: int) -> None:
        nonlocal next_item
        try:
            warm(list(lanes[k]))
            barrier.wait()
            while True:
                with turn:
                    turn.wait_for(functools.partial(my_turn_or_done, k))
                    if next_item >= len(order):
                        return
                    item = order[next_item]
                capture(item)  # the others wait on ``turn``
                with turn:
                    next_item += 1
                    turn.notify_all()
        except threading.BrokenBarrierError:
            return  # another lane failed
        except BaseException as err:
            errors.append(err)
            barrier.abort()
            with turn:
                next_item = len(order)
                turn.notify_all()

    threads = [
        threading.Thread(target=run, args=(k,), name=f"warm-{k}", daemon=True) for k in range(1, len(lanes))
    ]
    for th in threads:
        th.start()
    run(0)
    for th in threads:
        th.join()
    if errors:
        raise errors[0]


class CudaGraphs:
    def __init__(self, device: torch.device, enabled: bool, warm_threads: int = 0) -> None:
        self.device = device
        self.enabled = enabled and device.type == "cuda"
        self.warm_threads = warm_threads  # capture: the main lane's threads (0: every lane on one)
        self._entries: dict[Hashable, _Entry] = {}
        self._pools: dict[str, Any] = {}  # pool name -> torch's graph pool handle
        self._capture_streams: dict[str, torch.cuda.Stream] = {}  # pool name -> the stream it is captured on
        self.capture_s = 0.0
        self.phase_s: dict[str, dict[str, float]] = {}  # kind -> eager / capture seconds (start-up log)

    def add(
        self,
        key: Hashable,
        body: Body,
        example: Tensor,
        pool: str = "main",
        priority: int = 0,
        warm_lane: str = "main",
    ) -> None:
        """Register a body for inputs shaped like ``example`` (int64; its rows must be harmless to run:
        padding slots), in memory pool ``pool``, captured by ``capture`` on a stream of ``priority``
        (the pool's graphs are replayed on a stream of that priority). ``warm_lane``: the "main"
        lane's bodies warm on ``warm_threads`` threads, each other lane's on one more (``capture``)."""
        if key in self._entries:
            raise ValueError(f"graph {key!r} registered twice")
        if example.dtype != torch.int64:
            raise TypeError(f"graph inputs are int64, got {example.dtype} for {key!r}")
        self._entries[key] = _Entry(
            body,
            example.to(self.device).clone(),
            pool=pool,
            priority=priority,
            kind=_kind(key),
            warm_lane=warm_lane,
        )

    def capture(self) -> None:
        """Warm and capture every registered body, largest input first; logs where the time went.

        The warm-up runs are most of start-up and they wait on different things: the talker's on
        Triton compiling its kernels (the host; its LLVM and ptxas stages release the GIL, so the
        main lane spreads over ``warm_threads`` threads), the codec's on cuDNN timing its convs (the
        GIL released). Each lane warms on a thread and a stream of its own, all at once; then every
        body is captured, one at a time and largest first, on the thread that warmed it: torch keeps
        cuDNN's timed algorithms per thread, and a capture on another thread would time them again
        inside the capture, which invalidates it."""
        if not self.enabled or all(e.graph is not None for e in self._entries.values()):
            return
        t0 = time.perf_counter()
        order = sorted(self._entries.values(), key=lambda e: e.input.numel(), reverse=True)
        lanes: dict[str, list[_Entry]] = {}
        main = 0  # the main lane's entries round robin over its threads, the largest spread first
        for e in order:
            lane = e.warm_lane if self.warm_threads else ""
            if lane == "main":
                lane, main = f"main-{main % self.warm_threads}", main + 1
            lanes.setdefault(lane, []).append(e)
        # thread-local, so the warm threads take the caller's: grad mode, and the device ("cuda"
        # names the current one)
        grad = torch.is_grad_enabled()
        index = torch.cuda.current_device() if self.device.index is None else self.device.index
        warm_s = 0.0

        def warmed() -> None:  # once every lane has warmed, before the first capture
            nonlocal warm_s
            torch.cuda.synchronize(self.device)
            warm_s = time.perf_counter() - t0

        def warm(entries: list[_Entry]) -> None:
            torch.cuda.set_device(index)
            torch.set_grad_enabled(grad)
            self._warm(entries)

        try:
            in_turns(list(lanes.values()), order, warm, self._capture_one, warmed)
        except RuntimeError as err:  # torch.AcceleratorError: a capture invalidated after all
            if len(lanes) == 1:
                raise
            log.warning("graph capture on %d warm threads failed (%s): the rest on one", len(lanes), err)
            rest = [e for e in order if e.graph is None]
            in_turns([rest], rest, warm, self._capture_one, warmed)
        torch.cuda.synchronize(self.device)
        self.capture_s = time.perf_counter() - t0
        log.info(
            "%d graphs in %.1f s (warm-up runs %.1f s on %d lanes at once): %s",
            len(order),
            self.capture_s,
            warm_s,
            len(lanes),
            ", ".join(
                f"{kind} x{sum(e.kind == kind for e in order)} eager {t['eager']:.1f} s capture {t['capture']:.1f} s"
                for kind, t in self.phase_s.items()
            ),
        )
        log.info(
            "slowest warm-ups: %s",
            ", ".join(f"{k} {v:.1f} s" for k, v in list(self.eager_seconds().items())[:8]),
        )

    def _warm(self, entries: list[_Entry]) -> None:
        """The warm-up runs of one lane's entries, on a side stream of this thread."""
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for e in entries:
                t = time.perf_counter()
                for _ in range(WARMUP_RUNS):
                    e.body(e.input)
                side.synchronize()  # the eager runs' time is the host's (JIT, compile, cuDNN timing)
                self._time(e, "eager", time.perf_counter() - t)

    def _capture_one(self, e: _Entry) -> None:
        if e.graph is not None:
            return
        t = time.perf_counter()
        g = torch.cuda.CUDAGraph()
        pool = self._pools.get(e.pool)
        if pool is None:
            pool = self._pools[e.pool] = torch.cuda.graph_pool_handle()
            self._capture_streams[e.pool] = torch.cuda.Stream(self.device, priority=e.priority)
        with torch.cuda.graph(g, pool=pool, stream=self._capture_streams[e.pool]):
            e.output = e.body(e.input)
        e.graph = g
        self._time(e, "capture", time.perf_counter() - t)

    def eager_seconds(self) -> dict[str, float]:
        """Each graph's warm-up seconds at capture, slowest first (where start-up time goes)."""
        ranked = sorted(self._entries.items(), key=lambda kv: -kv[1].eager_s)
        return {str(k): round(e.eager_s, 2) for k, e in ranked}

    def _time(self, e: _Entry, phase: str, seconds: float) -> None:
        if phase == "eager":
            e.eager_s += seconds
        self.phase_s.setdefault(e.kind, {"eager": 0.0, "capture": 0.0})[phase] += seconds

    def capture_stream(self, pool: str) -> torch.cuda.Stream | None:
        """The stream ``pool``'s graphs were captured on (None before capture or off CUDA)."""
        return self._capture_streams.get(pool)

    def has(self, key: Hashable) -> bool:
        return key in self._entries

    def run(self, key: Hashable, rows: np.ndarray, staging: Staging | None = None) -> Tensor:
        """rows: the full static input of ``key`` (padding included), int64 -> the static output.

        ``staging``: copy the rows through its pinned memory without waiting (a pageable copy first
        waits for the stream's earlier work, which would hold the host while an earlier call of an
        overlapped stream runs); the caller releases it once it has synchronized."""
        e = self._entries.get(key)
        if e is None:
            raise KeyError(f"no graph {key!r}; registered: {sorted(map(str, self._entries))}")
        if rows.shape != tuple(e.input.shape) or rows.dtype != np.int64:
            raise ValueError(
                f"graph {key!r} takes int64 {tuple(e.input.shape)}, got {rows.dtype} {rows.shape}"
            )
        # without ``staging``, a plain (pageable) copy: torch waits for the stream to finish it, so the
        # host also waits for everything queued before it (fine for warm-up and one-off calls)
        if staging is not None:
            staging.copy_into(e.input, rows)
        else:
            e.input.copy_(torch.from_numpy(rows))
        if e.graph is not None:
            e.graph.replay()
        else:
            e.output = e.body(e.input)
        assert e.output is not None
        return e.output

    def __len__(self) -> int:
        return len(self._entries)
