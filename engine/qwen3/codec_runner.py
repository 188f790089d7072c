"""The streaming codec over the model's slots: a tick's due chunks of codes -> PCM per chunk.

    stateful (the default)  every slot's decoder state is a row of a CodecStatePool (codec_state.py);
                            a tick's chunks go into the codec calls ``plan_codec_calls`` picks, each
                            padded to a common graphed frame count and a batch bucket (one CUDA graph
                            per (bucket, frames)), every call queued before the one device->host copy.
                            On CUDA the calls run on the codec's own stream (``decode_start``), so the
                            engine can run the next frame step while they do; their graphs have their
                            own memory pool for that reason. Urgent chunks (a new stream's first, the
                            next ones of a stream about to run dry: a few of 1-4 frames a tick) run on
                            a lane of their own, a stream of the highest priority with graphs in a
                            pool of their own, so they never wait behind a bulk call of 50 ms
    windowed                the stateless reference: each chunk re-decodes ``windowed_left_context``
                            earlier frames of its slot and keeps the new samples

The model (model.py) owns the slots and the frame step; this owns what a slot's codec needs.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np
import torch
from torch import Tensor

from ..model import DecodeWork, Queued
from .codec_decoder import CodecDecoder
from .codec_plan import padded_frames, plan_codec_calls
from .codec_state import CodecStatePool
from .cuda_graphs import CudaGraphs, bucket_for, frame_ladder, powers_of_two
from .host_staging import PinnedBlocks, Staging, to_device
from .options import ServeOptions

# The urgent lane's graphs (decode_start): its chunks are a new stream's 1 frame and the 2 and 4
# after it, a few a tick; an urgent piece with more rows or frames runs with the bulk work
URGENT_FRAMES = (1, 2, 4)
URGENT_ROWS = 16
URGENT_PRIORITY = -100  # torch clamps it to the device's highest stream priority
# A graph of more frames and at least SPLIT_ROWS rows runs them as calls of LONGEST_CALL_FRAMES:
# cuDNN timing the conv algorithms of its own shapes was the slowest part of start-up (31 s for 64
# rows x 48 frames on the H200), and two 24-frame calls cost 3% (64 rows) to 11% (16 rows) more than
# one 48-frame call. Fewer rows time their own shapes in seconds and gain 25-60% by it
# (codec_cudnn_limit_h200.json)
LONGEST_CALL_FRAMES = 24
SPLIT_ROWS = 16
_NO_PCM = np.zeros(0, np.float32)  # the audio of every chunk of no frames (nothing in it to change)


@dataclass(frozen=True)
class _Lane:
    """One lane's graphs: their key's kind, row buckets, frame counts, padding slot, stream priority."""

    kind: str
    buckets: tuple[int, ...]
    frames: tuple[int, ...]
    pad_slot: int
    priority: int = 0


class CodecRunner:
    def __init__(
        self,
        codec: CodecDecoder,
        codebooks: int,
        options: ServeOptions,
        graphs: CudaGraphs,
        pad_slot: int,
        device: torch.device,
    ) -> None:
        self.codec, self.q, self.options, self.graphs = codec, codebooks, options, graphs
        self.pad_slot, self.device = pad_slot, device
        # one row per slot and a padding slot for each lane's graph buckets: the lanes' padding rows
        # run at once, so they keep apart
        self.urgent_pad_slot = pad_slot + 1
        self.states = CodecStatePool(pad_slot + 2, codec.state_width, next(codec.parameters()).dtype, device)
        self.buckets = options.codec_batch_buckets or powers_of_two(options.max_batch_size)
        # the chunk schedule's sizes (1, 2, 4, 8, 12, and 24, 48 for streams far ahead): its chunks
        # pad nothing, a final remainder pads to the next size
        self.frames = frame_ladder(options.codec_graph_frames)
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.urgent_stream = (
            torch.cuda.Stream(device, priority=URGENT_PRIORITY)
            if self.stream is not None and options.codec_mode == "stateful"
            else None
        )
        # the calls' inputs, through pinned blocks reused (host_staging.py)
        self._pinned = PinnedBlocks() if self.stream is not None else None
        self.bulk = _Lane("codec", self.buckets, self.frames, pad_slot)
        self.urgent = _Lane(
            "codec_urgent",
            tuple(b for b in self.buckets if b <= URGENT_ROWS),
            tuple(t for t in URGENT_FRAMES if t in self.frames),
            self.urgent_pad_slot,
            URGENT_PRIORITY,
        )
        # the lanes share the slots' state rows: a slot's calls must run in order whichever lane
        # each is on. The bulk lane's next call follows the urgent lane's work begun before it
        # (short); an urgent call waits for no bulk one: chunks of a slot with a bulk call not done
        # go with the bulk work instead
        self._urgent_last: torch.cuda.Event | None = None  # urgent work not yet followed by the bulk lane
        self._bulk_last: dict[int, torch.cuda.Event] = {}  # slot -> its last bulk call's event
        self._history: dict[int, list[np.ndarray]] = {}  # windowed mode: each open slot's recent frames
        self._opened: set[int] = set()  # slots opened since their state rows were last reset
        self.wait_s = 0.0  # the caller blocked waiting for the codec's PCM (Model.device_wait_s)

    # --- slots -----------------------------------------------------------------------------------
    def open(self, slot: int) -> None:
        """A new stream on ``slot``: fresh decoder state, no frames before. The reset is queued with
        the next codec work (``reset_opened``), every slot opened since in one go."""
        self._opened.add(slot)
        self._history[slot] = []

    def reset_opened(self, early: bool = False) -> None:
        """The decoder state of the slots opened since the last call, reset. On CUDA the reset is
        queued on the codec's stream, after any codec call still writing a slot's state for its
        previous owner and before the new owner's: the frame steps on the caller's stream never
        wait for it. With an urgent lane the reset is queued there, where a new owner's first chunk
        runs. ``early`` (ahead of the slots' first chunks): only the slots with no codec call of a
        previous owner still running, whose wait would hold up the urgent lane meanwhile."""
        if early and self.urgent_stream is not None:
            busy = {s for s in self._opened if (e := self._bulk_last.get(s)) is not None and not e.query()}
            slots = sorted(self._opened - busy)
            self._opened = busy
        else:
            slots = sorted(self._opened)
            self._opened.clear()
        if not slots:
            return
        # the rows' upload is queued on the stream that resets them
        if self.urgent_stream is not None:
            # a cancelled owner's call may still be running
            before = [e for s in slots if (e := self._bulk_last.pop(s, None)) is not None and not e.query()]
            with torch.cuda.stream(self.urgent_stream):
                for e in before:
                    self.urgent_stream.wait_event(e)
                self.states.reset(to_device(slots, torch.int64, self.device))
                self._urgent_last = _recorded(self.urgent_stream)
        else:
            with torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext():
                self.states.reset(to_device(slots, torch.int64, self.device))

    def prime(self, slot: int, codes: np.ndarray) -> None:
        """Advance a freshly opened slot's decoder over frames that come before its stream (an
        in-context voice's reference codes, (F, 16)), their audio discarded: the stream's first
        frames then decode as the continuation of the reference, which is what the official
        implementation plays (it decodes reference + generated codes and cuts the reference's
        samples). In the graphed lengths: at most a few ms a clip on the GPU."""
        if self.options.codec_mode == "windowed":
            self._history[slot] = [codes[-self.options.windowed_left_context :]]
            return
        longest = self.frames[-1]
        for t in range(0, len(codes), longest):
            part = codes[t : t + longest]
            self.decode([DecodeWork(slot=slot, frames=[part], n_frames=len(part), final=False)])

    def close(self, slot: int) -> None:
        """Forget the slot's windowed history (its state row is reset by the next ``open``)."""
        self._history.pop(slot, None)

    # --- graphs ----------------------------------------------------------------------------------
    def register_graphs(self) -> None:
        """One body per (batch bucket, frame count), with padding-slot example rows (stateful mode)."""
        if self.options.codec_mode != "stateful":
            return
        keys = [
            (lane, b, t)
            for lane in ((self.bulk, self.urgent) if self.urgent_stream is not None else (self.bulk,))
            for b in lane.buckets
            for t in lane.frames
        ]
        warm = warm_lanes([(b, t) for _, b, t in keys], self.options.experimental.codec_warm_threads)
        for (lane, b, t), warm_lane in zip(keys, warm, strict=True):
            example = torch.zeros(b, self.q * t + 2, dtype=torch.int64)  # 0 valid frames
            example[:, -1] = lane.pad_slot
            self.graphs.add(
                (lane.kind, b, t),
                self.body,
                example,
                pool=lane.kind,
                priority=lane.priority,
                warm_lane=warm_lane,
            )

    def body(self, packed: Tensor) -> Tensor:
        """packed (B, 16 T + 2): codes (frame-major) | valid frames n_b | slot -> pcm (B, T * 1920).

        Each slot's state and position advance by its n_b frames; the samples past n_b * 1920 are
        padding. Padding rows carry 0 valid frames, so the padding slot's state never moves.
        """
        b, width = packed.shape
        t = (width - 2) // self.q
        codes = packed[:, :-2].view(b, t, self.q).transpose(1, 2)  # (B, 16, T)
        n_valid, slots = packed[:, -2], packed[:, -1]
        state, start = self.states.gather(slots)
        longest = LONGEST_CALL_FRAMES
        if t <= longest or b < SPLIT_ROWS:
            pcm, state, start = self.codec.stream(codes, state, start, n_valid)
        else:  # in calls of `longest` frames: a row's valid frames are the first of each part
            parts = []
            for t0 in range(0, t, longest):
                n = (n_valid - t0).clamp(0, longest)
                part, state, start = self.codec.stream(
                    codes[..., t0 : t0 + longest], state, start, n
                )
                parts.append(part)
            pcm = torch.cat(parts, dim=1)
        self.states.scatter(slots, state, start)
        return pcm

    # --- decode ----------------------------------------------------------------------------------
    def decode(self, work: Sequence[DecodeWork]) -> list[np.ndarray]:
        """All due chunks of all streams -> their PCM (``decode_start`` and its result at once)."""
        return self.decode_start(work)()

    @torch.no_grad()
    def decode_start(self, work: Sequence[DecodeWork], urgent: bool = False) -> Queued[list[np.ndarray]]:
        """Queue the due chunks' codec calls (those ``plan_codec_calls`` picks, usually one) and the one
        device->host copy of their PCM; calling the result waits for it. On CUDA the calls run on the
        codec's stream, beside the caller's (the frame steps, queued before or after), and the
        result's ``done`` asks whether they have finished without waiting. ``urgent``: as one call
        on the urgent lane, where it fits (module docstring)."""
        self.reset_opened()  # before any call that reads a new stream's state
        out = [_NO_PCM] * len(work)
        if self.options.codec_mode == "windowed":
            pcm = [self._decode_windowed(w) if w.n_frames else o for w, o in zip(work, out, strict=True)]
            return Queued.finished(pcm)
        due = sorted((i for i, w in enumerate(work) if w.n_frames), key=lambda i: -work[i].n_frames)
        if not due:
            return Queued.finished(out)
        frames = [work[i].n_frames for i in due]
        lane = self.urgent if urgent and self._fits_urgent(work, due) else self.bulk
        if lane is self.urgent:
            groups = [due]
        else:
            groups = [[due[j] for j in g] for g in plan_codec_calls(frames, self.frames, self.buckets)]
        frame_samples = self.codec.cfg.frame_samples

        def fill(hosts: list[np.ndarray]) -> list[np.ndarray]:
            for group, pcm_host in zip(groups, hosts, strict=True):
                for r, i in enumerate(group):
                    out[i] = pcm_host[r, : work[i].n_frames * frame_samples]
            return out

        if self.stream is None:  # run now, as on CUDA: a slot opened before the result keeps its reset
            hosts_now = [self._run([work[i] for i in g], lane).numpy() for g in groups]
            return Queued.finished(fill(hosts_now))
        stream = self.urgent_stream if lane is self.urgent else self.stream
        assert stream is not None
        staging = Staging(self._pinned, self.device)  # the calls' inputs, until the copy back is waited for
        with torch.cuda.stream(stream):
            if stream is self.stream and self._urgent_last is not None:
                stream.wait_event(self._urgent_last)
                self._urgent_last = None
            pcms, hosts = [], []
            for group in groups:  # each call's PCM copied out before the next call can replay its graph
                on_device = self._run([work[i] for i in group], lane, staging)
                # PCM blocks of their own, not reused: the chunks handed out are views of them
                host = torch.empty(on_device.shape, dtype=on_device.dtype, pin_memory=True)
                host.copy_(on_device, non_blocking=True)
                pcms.append(on_device)
                hosts.append(host)
            done = _recorded(stream)
        if stream is self.stream:
            self._bulk_last.update((work[i].slot, done) for i in due)
        else:
            self._urgent_last = done

        def finish() -> list[np.ndarray]:
            t0 = time.perf_counter()
            done.synchronize()
            self.wait_s += time.perf_counter() - t0
            staging.release()
            pcms.clear()
            return fill([h.numpy() for h in hosts])

        return Queued(finish, done.query)

    def _fits_urgent(self, work: Sequence[DecodeWork], due: list[int]) -> bool:
        """The urgent lane takes these chunks: one graphed call, and no slot with a bulk call that
        may still be running (its chunk must follow that call, so it goes behind it)."""
        if self.urgent_stream is None or len(due) > self.urgent.buckets[-1]:
            return False
        if max(work[i].n_frames for i in due) > self.urgent.frames[-1]:
            return False
        for i in due:
            before = self._bulk_last.get(work[i].slot)
            if before is not None:
                if not before.query():
                    return False
                del self._bulk_last[work[i].slot]
        return True

    def _run(self, chunks: list[DecodeWork], lane: _Lane, staging: Staging | None = None) -> Tensor:
        """One codec call on ``lane``: the chunks padded to a common frame count T -> pcm
        (len(chunks), T * 1920) on the device, row r's audio in its first n_frames * 1920 samples:
        a view of the graph's static output, which the next replay of that graph overwrites (queued
        behind it on the same stream: the caller copies it out first)."""
        n = len(chunks)
        n_frames = np.array([w.n_frames for w in chunks], np.int64)
        t = padded_frames(int(n_frames.max()), lane.frames)
        b = bucket_for(n, lane.buckets)
        rows = np.zeros((b, self.q * t + 2), np.int64)  # padding frames: code 0, decoded and dropped
        rows[:, -1] = lane.pad_slot  # padding rows: 0 valid frames of the padding slot
        # every chunk's frames in one copy: row r's first n_frames[r] frames, in order
        codes = rows[:n, : self.q * t].reshape(n, t, self.q)
        codes[np.arange(t) < n_frames[:, None]] = _frames(chunks)
        rows[:n, -2] = n_frames
        rows[:n, -1] = [w.slot for w in chunks]
        if self.graphs.has((lane.kind, b, t)):
            pcm = self.graphs.run((lane.kind, b, t), rows, staging)
        else:  # a chunk longer than the graphed frame counts: eager, exact shape
            x = torch.from_numpy(rows).to(self.device) if staging is None else staging.put(rows, torch.int64)
            pcm = self.body(x)
        return pcm[:n]

    def _decode_windowed(self, w: DecodeWork) -> np.ndarray:
        history = self._history.get(w.slot)
        frames = _frames([w]).astype(np.int64, copy=False)
        ctx = self.options.windowed_left_context
        window = np.concatenate([*(history or []), frames])
        if history is not None:
            self._history[w.slot] = [window[-ctx:]]
        codes = torch.from_numpy(window).to(self.device).T[None]  # (1, 16, T)
        return self.codec.decode_windowed(codes, w.n_frames, ctx)[0].cpu().numpy()


def conv_shapes(rows: int, frames: int) -> tuple[int, int]:
    """The (rows, frames) a codec graph's convs run at: a split graph's are its parts'."""
    split = frames > LONGEST_CALL_FRAMES and rows >= SPLIT_ROWS
    return (rows, LONGEST_CALL_FRAMES) if split else (rows, frames)


def warm_lanes(shapes: list[tuple[int, int]], threads: int) -> list[str]:
    """The start-up warm thread of each (rows, frames) codec graph. cuDNN times the conv algorithms
    of each new shape once a process, mostly host work with the GIL released, ~1-2 s a graph on the
    H200 whatever its size (building and timing each layer's plans): spread over ``threads``
    threads, graphs whose convs run at the same shapes (both lanes' graphs of one size, a split
    graph and its parts') on one, so no shape is timed twice at once."""
    cost: dict[tuple[int, int], float] = {}
    for s in shapes:
        rows, frames = conv_shapes(*s)
        cost[(rows, frames)] = 1.0 + rows * frames / 512  # a fixed cost a shape, then its work
    load = [0.0] * max(1, threads)
    lane_of: dict[tuple[int, int], int] = {}
    for shape in sorted(cost, key=lambda k: -cost[k]):
        lane_of[shape] = load.index(min(load))
        load[lane_of[shape]] += cost[shape]
    return [f"codec-{lane_of[conv_shapes(*s)]}" for s in shapes]


def _recorded(stream: torch.cuda.Stream) -> torch.cuda.Event:
    event = torch.cuda.Event()
    event.record(stream)
    return event


def _frames(chunks: Sequence[DecodeWork]) -> np.ndarray:
    """The chunks' frame payloads, (F, 16) each, as one (sum F, 16) array, in order."""
    parts: list[np.ndarray] = []
    for w in chunks:
        frames = cast("list[np.ndarray]", w.frames)  # (1, 16) rows of a step, or (F, 16) blocks (a primed reference)
        n = sum(map(len, frames))
        if n != w.n_frames:
            raise ValueError(f"slot {w.slot}: {n} frames in the payload, n_frames says {w.n_frames}")
        parts += frames
    return np.concatenate(parts) if parts else np.zeros((0, 16), np.int64)
