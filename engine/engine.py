"""The engine: one worker thread that owns the model and runs every stream's work.

Model work never runs on the asyncio loop. Callers (on the loop) open streams and push text; the
commands reach the worker through a thread-safe queue. The worker's step is three verbs:

    schedule (which slots generate) -> run (model.generate, then model.decode of due chunks)
    -> postprocess (lead-in trim, hand chunks back to each stream's loop)

Audio flows back with ``loop.call_soon_threadsafe``, a piece of codec work's chunks in one call per
loop (outbox.py). Cancel frees a stream's slot when the worker next drains its commands, between
two steps (a step is a few ms for the embedded voice).

A model whose stage 2 runs on a device queue of its own (Qwen3-TTS on CUDA) is driven as a pipeline:

    begin step k (queued behind step k - 1 where the model allows two in flight and step k - 1 is a
    loaded one, EngineConfig.queue_ahead_min_rows, or a quiet one and step k has a first frame)
    -> take commands -> hand out finished codec work -> take step k - 1's codes and record them
    -> begin the codec work of the chunks they completed -> hand out finished codec work

so the device runs frame steps back to back while the worker records, plans and hands out audio, and
the codec runs beside them, its audio taken once done (the worker waits for it when nothing else is
in flight, when codec work piles up, and for a first chunk on a quiet device: EngineConfig.quiet_rows).
A slot released while a begun step uses it is freed once that step's results are in.

The worker's concerns each have a room below this file: who gets a stream (admission.py), the
commands (inbox.py), opens and text on their way to the model (intake.py), which streams are ready to
step (readiness.py), the two stages in flight (frame_stage.py, codec_stage.py), results on their way
to the streams' loops (outbox.py), a turn's model-time budget (turn_budget.py), voice cloning's thread
(cloner.py) and the garbage collector's frozen heap (heap_hold.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import threading
import time
from typing import Any

import numpy as np

from . import warm_load
from .admission import Admission, EngineBusy, kv_admits, tell
from .cloned_voice import ClonedVoice
from .cloner import Cloner
from .codec_stage import CodecStage
from .commands import Cancel, Stop
from .config import EngineConfig
from .frame_stage import FrameStage
from .heap_hold import HeapHold
from .inbox import Command, Inbox
from .intake import new_live, take_text
from .live import Live, OpenStream
from .model import Decoded, DecodeWork, GenerateResult, Model, ModelError, ModelInfo, StreamParams
from .outbox import Outbox
from .readiness import Readiness
from .scheduler import Scheduler, StepPlan
from .slots import SlotPool
from .stats import EngineStats
from .stream import Stream, StreamError
from .turn_budget import charge

log = logging.getLogger("voicewire.engine")

IDLE_WAIT_S = 0.5  # worker wakes at least this often when idle (for stop requests)
QUIET_POLL_S = 0.0001  # the worker's look at a quiet step (wait_taking), between waits for commands

__all__ = ["Engine", "EngineBusy", "EngineNotReady"]


class EngineNotReady(RuntimeError):
    """The engine is still loading or warming up (or has stopped): no stream can open yet."""


class Engine:
    def __init__(self, config: EngineConfig | None = None, model: Model | None = None) -> None:
        self.config = config or EngineConfig()
        self._model = model
        self._commands = Inbox(self.config.command_budget_s)
        self._thread: threading.Thread | None = None
        self._ids = itertools.count(1)
        self._live: dict[int, Live] = {}
        self._slots = SlotPool()
        self._admission = Admission()
        self._queued = self._admission.waiting
        self._stopping = False
        # Set once warm-up is done and the worker starts; cleared when it exits. Readiness probes
        # read it: an engine whose model exists but is still capturing graphs is not ready.
        self._worker_running = threading.Event()
        self._warm = False  # the warm load (warm_load.py) is done: only then is the engine ready
        self.stats = EngineStats()
        # begun work whose results are not taken yet, oldest first (the pipeline in the module docstring)
        cfg = self.config
        self._codec = CodecStage(cfg.max_decodes_in_flight, cfg.urgent_slack_s, self._emit_piece, self._decode_failed)
        self._outbox = Outbox(self._release)  # results to the streams' loops, a piece's chunks at once
        self._readiness = Readiness()  # the streams a step would make progress for (marked as they change)
        self._decoding = self._codec.work
        self._stepping = FrameStage(self._decoding, self._record, self._generate_failed, self._slots_freed)
        self._cloner = Cloner()
        self._device_wait_base = 0.0
        self._heap = HeapHold()

    # --- lifecycle ---------------------------------------------------------------------------
    @property
    def model(self) -> Model:
        if self._model is None:
            raise EngineNotReady("engine not started")
        return self._model

    @property
    def info(self) -> ModelInfo:
        """The served model's description (rate, voices, limits); raises EngineNotReady before load."""
        return self.model.info

    @property
    def onset_threshold_dbfs(self) -> float:
        """The level above which a 10 ms window counts as audible (lead-in trim, barge-in cut points)."""
        return self.config.level.onset_threshold_dbfs

    @property
    def ready(self) -> bool:
        """Warmed up and the worker is stepping: streams can open."""
        return self._warm and self._worker_running.is_set()

    def start(self) -> Engine:
        if self._thread is not None:
            return self
        if self._model is None:
            from .models import load_model

            self._model = load_model(self.config.model, self.config.model_options)
        self._model.warmup()
        self._slots = SlotPool(self._model.info.max_slots)
        chunks = self.config.chunks
        if chunks.slack_frames is None:
            chunks = dataclasses.replace(chunks, slack_frames=tuple(self._model.info.slack_chunk_frames))
        batch = min(self.config.max_batch or self._model.info.max_batch_size, self._model.info.max_batch_size)
        self._scheduler = Scheduler(chunks, batch, self.config.quiet_rows, self.config.urgent_slack_s)
        self._max_ahead_samples = int(self.config.max_ahead_s * self._model.info.sample_rate_hz)
        self._stepping.ahead = max(1, self._model.steps_in_flight) if self.config.queue_ahead else 1
        self._stepping.ahead_min_rows, self._stepping.quiet_rows = self.config.queue_ahead_min_rows, self.config.quiet_rows
        self._thread = threading.Thread(target=self._run, name="voicewire-engine", daemon=True)
        # Set before the thread runs so a caller may open streams as soon as start() returns;
        # the worker clears it when it exits (stop, or an error it cannot outlive).
        self._worker_running.set()
        self._thread.start()
        warm_load.run(self._open_stream, min(self._model.info.warm_load_streams, self.stream_limit))
        self._device_wait_base = self._model.device_wait_s()  # warm-up's waits are not a step's
        self.stats = EngineStats()  # nor are the warm load's streams
        # what warm-up and the warm load made goes into the frozen heap (heap.py), and the GC's
        # pauses since ready count from here
        self._heap.start(self.config.freeze_heap, self.config.full_collection_busy_max_s)
        self._warm = True
        return self

    def close(self) -> None:
        self._cloner.close()
        if self._thread is None:
            return
        self._commands.put(Stop())
        self._thread.join(timeout=10)
        self._thread = None
        self._heap.release()

    async def __aenter__(self) -> Engine:
        await asyncio.get_running_loop().run_in_executor(None, self.start)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.close)

    # --- public API (event loop side) ----------------------------------------------------------
    def open_stream(self, params: StreamParams | None = None, **kwargs: Any) -> Stream:
        """A new stream on the running loop. Raises ValueError for bad params, EngineBusy when full."""
        if not self.ready:
            raise EngineNotReady("the engine is starting (loading or warming up); try again shortly")
        return self._open_stream(params or StreamParams(**kwargs))

    def _open_stream(self, params: StreamParams) -> Stream:
        params.check(self.model.info)
        self._admission.reserve(self.stream_limit, self.config.max_queued_streams)
        stream = Stream(next(self._ids), asyncio.get_running_loop(), self._commands.put)
        self._commands.put(OpenStream(stream, params))
        return stream

    async def clone_voice(self, pcm: np.ndarray, sample_rate_hz: int, ref_text: str = "") -> ClonedVoice:
        """A cloned voice from a reference clip (float32 mono); see ``Model.clone_voice``. Runs on
        a thread of its own (cloner.py) while the worker keeps stepping. Raises
        CloningNotSupported, EngineNotReady, or ValueError for audio the model cannot use."""
        if not self.ready:
            raise EngineNotReady("the engine is starting (loading or warming up); try again shortly")
        voice = await self._cloner.clone(self.model, pcm, sample_rate_hz, ref_text)
        self.stats.voices_cloned += 1
        return voice

    def active_streams(self) -> int:
        """Streams the engine still holds (opened, not yet finished or freed), waiting ones included."""
        return self._admission.count

    @property
    def stream_limit(self) -> int:
        """Streams that run at once; up to ``max_queued_streams`` more wait for one of them to end."""
        return min(self.config.max_streams, self.model.info.max_slots)

    # --- worker ----------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._loop_until_stopped()
        finally:
            self._worker_running.clear()

    def _loop_until_stopped(self) -> None:
        while not self._stopping:
            try:
                self._heap.streams(self._admission.count)
                self._expire_queued()
                ready = self._ready()
                busy = bool(ready or self._stepping or self._decoding) or self._decode_pending()
                if self._drain(block=not busy):
                    ready = self._ready()
                if self._stopping:
                    break
                self._step(ready)
            except Exception:  # the worker serves every stream: it must outlive any one failure
                log.exception("engine step failed")
                time.sleep(0.01)
        self._stepping.settle(self._slots)  # the device idle when the worker ends
        self._decoding.settle()
        for live in list(self._live.values()):
            self._fail(live, StreamError("engine_closed", "the engine is shutting down"))
        for q in self._queued.take_all():
            tell(q.open, StreamError("engine_closed", "the engine is shutting down"))

    def _ready(self) -> set[int]:
        return self._readiness.current(self._live, self.model, self._max_ahead_samples)

    def _decode_pending(self) -> bool:
        return any(lv.request.generation_done and not lv.request.final_sent for lv in self._live.values())

    def _drain(self, block: bool, wait_s: float = IDLE_WAIT_S) -> bool:
        """Handles the commands that came in (waiting up to ``wait_s`` for one when ``block``), for up
        to ``command_budget_s``; True when there were any."""
        wait_s = min(wait_s, self._queued.seconds_left(time.perf_counter()))  # wake for its deadline
        n, spent_s = self._commands.drain(self._handle, wait_s if block else None)
        self.stats.commands += n
        self.stats.commands_s += spent_s
        return n > 0

    def _new_meanwhile(self) -> bool:
        """The commands that come in while a quiet step runs (FrameStage.wait_taking), a short wait
        for them at a time: True once a stream is ready for its first frame."""
        return self._drain(block=True, wait_s=QUIET_POLL_S) and self._scheduler.has_new(self._ready())

    def _handle(self, cmd: Command) -> None:
        if isinstance(cmd, Stop):
            self._stopping = True
            return
        if isinstance(cmd, OpenStream):
            if self._queued or not self._can_open():
                self._queued.add(cmd, time.perf_counter() + self.config.queue_wait_s)
                self.stats.streams_queued += 1
                return
            self._open(cmd.stream, cmd.params)
            return
        if cmd.stream_id in self._queued:
            if not self._queued.hold(cmd):  # a cancel: it stops waiting
                self._finish_count()
            return
        live = self._live.get(cmd.stream_id)
        if live is None:
            return  # finished or cancelled already
        try:
            if isinstance(cmd, Cancel):
                self._release(live)
            else:
                self._readiness.mark((live.stream.id,))
                take_text(self.model, live, cmd, self.config.max_buffered_text_chars)
        except StreamError as err:
            self._fail(live, err)
        except ModelError as err:
            self._fail(live, StreamError("model_error", str(err)))

    def _can_open(self) -> bool:
        # a slot freed during a frame step comes back after it: until then the stream waits
        return (
            len(self._live) < self.stream_limit
            and bool(self._slots)
            and kv_admits(self.model.kv_room(), len(self._live))
        )

    def _admit_queued(self) -> None:
        """Waiting opens, oldest first, into the streams that are free now."""
        while self._queued and self._can_open() and not self._stopping:
            q = self._queued.pop_oldest()
            self._open(q.open.stream, q.open.params)
            for cmd in q.commands:
                self._handle(cmd)

    def _expire_queued(self) -> None:
        for q in self._admission.expired(time.perf_counter()):
            self.stats.queue_timeouts += 1
            msg = f"engine is at its limit of {self.stream_limit} streams; none ended within {self.config.queue_wait_s:g} s"
            tell(q.open, StreamError("server_busy", msg))

    def _open(self, stream: Stream, params: StreamParams) -> None:
        model = self.model
        slot = self._slots.take()
        live = new_live(stream, params, slot, model, self.config)
        try:
            model.open_slot(slot, params)
        except Exception as err:  # a bad request must not take the worker down
            self._slots.put(slot)
            self._finish_count()
            self._outbox.post(live.loop, live, stream.fail, StreamError("bad_request", str(err)))
            return
        self._live[stream.id] = live
        self._readiness.mark((stream.id,))
        self._scheduler.add(live.request)
        self.stats.streams_opened += 1

    def _step(self, ready: set[int]) -> None:
        t0 = time.perf_counter()
        model = self.model
        if not self._stepping and self._decoding.urgent_out() and self._scheduler.can_wait(ready):
            self._decoding.take_urgent()  # a first chunk alone on a quiet device (EngineConfig.quiet_rows)
            ready = self._ready()
        room = self._stepping.has_room(lambda: self._scheduler.has_new(ready))
        plan = self._scheduler.plan_generate(ready) if room else None
        rows = 0
        if plan is not None and self._stepping.begin(model, self._slots, plan):
            rows = len(plan.generate_slots)
            self._readiness.mark(plan.generate_streams)  # their begun frames count in their readiness
        if not (self.config.overlap_decode and model.decode_overlaps):
            # stage 2 on the worker's own queue: the step's frames, then the chunks they complete
            while self._stepping:
                self._stepping.finish(self._slots)
            t1 = time.perf_counter()
            due = self._scheduler.plan_decode(t1)
            self._codec.begin(model, due)
            taken = self._decoding.take(wait=True)
        else:
            # the pipeline (module docstring): while the device runs the begun steps, the commands
            # that came in are taken and finished codec work is handed out; the oldest step's codes
            # are taken once another is queued behind it (or none will be)
            self._drain(block=False)
            taken = self._decoding.take(wait=False)
            stage = self._stepping
            if stage and (not stage.has_room() or not rows) and not stage.wait_taking(self._new_meanwhile):
                stage.finish(self._slots)
            t1 = time.perf_counter()
            due = self._scheduler.plan_decode(t1)
            self._codec.begin(model, due)
            taken += self._decoding.take(wait=not (self._stepping or rows))  # nothing else to wait for
        if not (rows or due or taken):
            return  # nothing was begun or handed out: not a step
        t2 = time.perf_counter()
        waited = model.device_wait_s() - self._device_wait_base + self._decoding.polled_s
        self.stats.record_step(t1 - t0, t2 - t1, rows, waited)
        self._heap.record(self.stats)

    def _slots_freed(self, freed: list[int]) -> None:
        for slot in freed:
            self._free_slot(slot)
        if freed:
            self._admit_queued()

    def _generate_failed(self, plan: StepPlan, err: Exception) -> None:
        self._readiness.mark(plan.generate_streams)
        if isinstance(err, ModelError):
            for live in [lv for lv in self._live.values() if lv.request.slot == err.slot]:
                self._fail(live, StreamError("model_error", str(err)))
            return
        log.error("generate failed for streams %s", plan.generate_streams, exc_info=err)
        for sid in plan.generate_streams:
            if sid in self._live:
                self._fail(self._live[sid], StreamError("model_error", f"model failed: {err}"))

    def _record(self, plan: StepPlan, results: list[GenerateResult]) -> None:
        self._readiness.mark(plan.generate_streams)
        lives, info, text = self._live, self.model.info, self.config.text
        for sid, res in zip(plan.generate_streams, results, strict=True):
            live = lives.get(sid)
            if live is None:
                continue
            if res.error is not None:
                log.warning("stream %d failed in the model: %s", sid, res.error)
                self._fail(live, StreamError("model_error", res.error))
                continue
            if res.finished and res.stop_reason is not None:
                live.stop_reason = res.stop_reason
            err = charge(live, res, info, text)
            if err is not None:
                self._fail(live, err)
        self._scheduler.record(plan, results)  # failed streams are gone from the scheduler already
        self.stats.frames_generated += sum(r.n_frames for r in results)

    def _emit_piece(self, chunks: list[tuple[DecodeWork, Decoded]]) -> None:
        with self._outbox.batch():
            for d, decoded in chunks:
                live = self._live.get(d.stream_id)
                if live is not None:  # else failed or cancelled meanwhile
                    self._emit(live, decoded, d.final, d.text)

    def _decode_failed(self, due: list[DecodeWork], err: Exception) -> None:
        log.error("decode failed", exc_info=err)
        for d in due:
            if d.stream_id in self._live:
                self._fail(self._live[d.stream_id], StreamError("model_error", f"decoder failed: {err}"))

    def _emit(self, live: Live, decoded: Decoded, final: bool, text: str) -> None:
        chunk = live.chunk(decoded, final, text)
        self._readiness.mark((live.stream.id,))  # its audio ahead of its caller grew
        if chunk is None:
            return  # held by the lead-in trim until audible audio (or the end) comes
        if final:
            self._release(live)  # freed before the caller can see the end of the stream
        self._outbox.post(live.loop, live, live.stream.deliver, chunk)

    def _fail(self, live: Live, err: StreamError) -> None:
        self.stats.streams_failed += 1
        self._release(live)
        self._outbox.post(live.loop, live, live.stream.fail, err)

    def _release(self, live: Live) -> None:
        sid = live.stream.id
        if self._live.pop(sid, None) is None:
            return
        self._readiness.drop(sid)
        self._scheduler.remove(sid)
        try:
            if self._slots.release(live.request.slot):
                self._free_slot(live.request.slot)
        finally:
            self._finish_count()
        self._admit_queued()

    def _free_slot(self, slot: int) -> None:
        try:
            self.model.close_slot(slot)
        finally:
            self._slots.put(slot)

    def _finish_count(self) -> None:
        self._admission.finish()
