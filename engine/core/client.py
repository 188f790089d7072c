"""The gateway side of one engine core: the async ``Engine`` API, served by another process.

``CoreClient`` has what the gateway uses of ``Engine`` (``open_stream``, ``info``, ``ready``,
``active_streams()``, ``stats``, ``config``, ``onset_threshold_dbfs``, async ``start``/``close`` and
``async with``) and hands out real ``Stream`` objects: their commands go to the core as messages,
the core's audio is delivered into them. Nothing here blocks the loop: commands are sent with
NOBLOCK on a socket with no queue limit, audio is read by one task.

Admission is decided here, synchronously, as the in-process engine does: the core announces its
limit when it is ready, and this side counts the streams it has open (one ends when the core says
so: final chunk, failure, or a cancel it has processed). ``open_stream`` raises ``EngineNotReady``
while the core is starting or down and ``EngineBusy`` at the limit.

A core that dies (crash, OOM, SIGKILL) ends every stream it held with ``model_error``; the client
stays usable and ``start()`` runs a fresh core on the same sockets (``EngineGroup`` does that).

A *shared* core (``ray_client.RemoteCoreClient``: one that several gateways front) also holds
other gateways' streams: then admission and ``free_streams()`` count what the core reports in its
heartbeat (``Stats.active_streams``, twice a second) plus what this side opened since.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import itertools
import logging
import os
import pickle
import shutil
import sys
import tempfile
import time
from typing import Any

import numpy as np
import zmq
import zmq.asyncio

from voicewire.engine import (
    ClonedVoice,
    CloningNotSupported,
    EngineBusy,
    EngineConfig,
    EngineNotReady,
    EngineStats,
    ModelInfo,
    Stream,
    StreamError,
    StreamParams,
)
from voicewire.engine.commands import StreamCommand

from .messages import (
    Audio,
    CloneFailed,
    CloneVoice,
    Closed,
    Consumed,
    Failed,
    OpenStream,
    Ready,
    Shutdown,
    StartFailed,
    Stats,
    ToCore,
    VoiceCloned,
    decode_all_from_core,
    encode_to_core,
)
from .outgoing import Outgoing
from .process import CoreSpec

log = logging.getLogger("voicewire.engine.core")

# How often consumption is reported. The bound it feeds is max_ahead_s (30 s by default), so
# 50 ms of staleness is nothing; reporting per chunk would double the messages.
CONSUMED_REPORT_S = 0.05
SHUTDOWN_TIMEOUT_S = 10.0  # a core that has not exited this long after Shutdown is killed


class CoreState(enum.Enum):
    STOPPED = "stopped"  # not started, or closed
    STARTING = "starting"  # the process runs, the model loads or warms up
    READY = "ready"  # warmed up and stepping
    DOWN = "down"  # the process died; its streams ended with model_error


class CoreStartFailed(RuntimeError):
    """The core's model could not load or warm up, or the process died before it was ready."""


class CoreClient:
    shared = False  # other gateways open streams on this core too (RemoteCoreClient)

    def __init__(self, config: EngineConfig | None = None, *, name: str = "core-0", device: str = "") -> None:
        self.config = config or EngineConfig()
        self.name = name
        self.device = device  # replaces model_options["device"] where the model takes one
        self.state = CoreState.STOPPED
        self.stats = EngineStats()
        self.restarts = 0  # starts after the first
        self.last_exit: str | None = None  # how the last process ended, for /readyz
        self._info: ModelInfo | None = None
        self._max_streams = 0
        self._ids = itertools.count(1)
        self._streams: dict[int, Stream] = {}  # open on the core (its slot is not known free yet)
        self._core_active = 0  # streams the core said it held in its last heartbeat (every gateway's)
        self._opened_since_stats = 0  # streams this side opened since that heartbeat
        self._reported: dict[int, int] = {}  # consumption last sent per stream
        self._clones: dict[int, asyncio.Future[ClonedVoice]] = {}  # clone requests the core has not answered
        self._ctx: zmq.asyncio.Context | None = None
        self._to_core: zmq.Socket[bytes] | None = None  # plain socket: sends never wait
        self._outgoing = Outgoing(self._send_frames)  # a loop pass's commands as one message
        self._from_core: zmq.asyncio.Socket | None = None
        self._ipc_dir: str | None = None
        self._process: asyncio.subprocess.Process | None = None
        self._exited: asyncio.Future[int] | None = None
        self._ready: asyncio.Future[None] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._starts = 0
        self._t_heard = time.monotonic()  # last message from the core
        self._closing = False  # close() asked the core to stop: its streams end with engine_closed

    # --- the Engine API ----------------------------------------------------------------------
    @property
    def info(self) -> ModelInfo:
        """The served model (known once the core was ready; kept while it restarts)."""
        if self._info is None:
            raise EngineNotReady("the engine core is starting (loading or warming up); try again shortly")
        return self._info

    @property
    def onset_threshold_dbfs(self) -> float:
        return self.config.level.onset_threshold_dbfs

    @property
    def ready(self) -> bool:
        return self.state is CoreState.READY

    @property
    def max_streams(self) -> int:
        """The core's announced limit (0 before it was first ready)."""
        return self._max_streams

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def active_streams(self) -> int:
        """Streams this side has open on the core."""
        return len(self._streams)

    def load(self) -> int:
        """Streams the core holds as far as this side knows: its own, and for a shared core what the
        core last reported plus what this side opened since (an overestimate for at most 0.5 s)."""
        if not self.shared:
            return len(self._streams)
        return max(len(self._streams), self._core_active + self._opened_since_stats)

    def free_streams(self) -> int:
        """Streams the core can take now (0 unless ready): what the gateway routes new sessions by."""
        return max(0, self._max_streams - self.load()) if self.ready else 0

    def silent_s(self) -> float:
        """Seconds since the core last sent anything (it reports its stats every 0.5 s)."""
        return time.monotonic() - self._t_heard

    def open_stream(self, params: StreamParams | None = None, **kwargs: Any) -> Stream:
        """A new stream on the running loop; ValueError for bad params, EngineBusy when full."""
        if self.state is not CoreState.READY:
            what = "is restarting" if self.state is CoreState.DOWN else "is starting"
            raise EngineNotReady(f"the engine core {self.name} {what}; try again shortly")
        params = params or StreamParams(**kwargs)
        params.check(self.info)
        # the core's engine queues opens past its limit (EngineConfig.max_queued_streams): counted here too
        if self.load() >= self._max_streams + self.config.max_queued_streams:
            queued = self.config.max_queued_streams
            raise EngineBusy(
                f"engine is at its limit of {self._max_streams} streams"
                + (f" and {queued} waiting" if queued else "")
            )
        sid = next(self._ids)
        self._send(OpenStream(sid, params))  # ValueError before the stream exists, if it cannot go
        stream = Stream(sid, asyncio.get_running_loop(), self._post)
        self._streams[sid] = stream
        self._reported[sid] = 0
        self._opened_since_stats += 1
        return stream

    async def clone_voice(self, pcm: np.ndarray, sample_rate_hz: int, ref_text: str = "") -> ClonedVoice:
        """``Engine.clone_voice`` in the core (on its clone thread). Raises CloningNotSupported,
        EngineNotReady, ValueError (a clip the model refused) or RuntimeError (the model or the core
        failed)."""
        if self.state is not CoreState.READY:
            raise EngineNotReady(f"the engine core {self.name} is not ready; try again shortly")
        if not self.info.voice_encoder:
            raise CloningNotSupported(f"{self.info.name} cannot clone voices")
        rid = next(self._ids)
        future: asyncio.Future[ClonedVoice] = asyncio.get_running_loop().create_future()
        self._clones[rid] = future
        try:
            self._send(CloneVoice(rid, np.asarray(pcm, np.float32), sample_rate_hz, ref_text))
            return await future
        finally:
            self._clones.pop(rid, None)

    # --- lifecycle -----------------------------------------------------------------------------
    async def start(self) -> CoreClient:
        """Run a core process and wait until it is warm. Raises CoreStartFailed."""
        if self.state in (CoreState.STARTING, CoreState.READY):
            return self
        loop = asyncio.get_running_loop()
        if self._ctx is None:
            self._bind()
        assert self._ipc_dir is not None
        self.state = CoreState.STARTING
        self._ready = loop.create_future()
        self._exited = loop.create_future()
        spec = CoreSpec(
            engine=self._engine_config(),
            to_core_address=f"ipc://{self._ipc_dir}/to-core",
            from_core_address=f"ipc://{self._ipc_dir}/from-core",
            name=self.name,
            parent_pid=os.getpid(),
            sys_path=tuple(sys.path),
            log_level=logging.getLogger().getEffectiveLevel(),
        )
        # A fresh interpreter, not a fork: the gateway has threads (executors, aiortc) a forked
        # child would inherit. The spec (configuration, never audio) goes in on stdin.
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "voicewire.engine.core", stdin=asyncio.subprocess.PIPE
        )
        assert process.stdin is not None
        process.stdin.write(pickle.dumps(spec))
        process.stdin.close()
        self._process = process
        if self._starts:
            self.restarts += 1
        self._starts += 1
        self._tasks = [t for t in self._tasks if not t.done()]  # earlier processes' watchers
        self._tasks.append(asyncio.create_task(self._watch(process), name=f"{self.name}-watch"))
        ready, exited = self._ready, self._exited
        either: list[asyncio.Future[Any]] = [ready, exited]
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        if ready.done() and ready.exception() is None:
            return self
        err = ready.exception() if ready.done() else None
        await exited  # a core that failed its start exits on its own
        raise err or CoreStartFailed(f"the engine core exited before it was ready ({self.last_exit})")

    async def close(self) -> None:
        """Stop the core (its streams end with ``engine_closed``) and release the sockets."""
        process = self._process
        self._closing = True
        if process is not None and process.returncode is None:
            self._send(Shutdown())
            self._outgoing.flush()
            assert self._exited is not None
            try:
                await asyncio.wait_for(asyncio.shield(self._exited), SHUTDOWN_TIMEOUT_S)
            except TimeoutError:
                process.kill()
                await self._exited
        for task in self._tasks:
            task.cancel()
        self._tasks.clear()
        if self._to_core is not None and self._from_core is not None and self._ctx is not None:
            self._to_core.close(linger=0)
            self._from_core.close(linger=0)
            self._ctx.term()
        self._ctx = self._to_core = self._from_core = None
        if self._ipc_dir is not None:
            shutil.rmtree(self._ipc_dir, ignore_errors=True)
            self._ipc_dir = None
        self.state = CoreState.STOPPED
        self._closing = False

    def kill(self) -> None:
        """SIGKILL the core process (a hung core; tests)."""
        if self._process is not None and self._process.returncode is None:
            self._process.kill()

    async def wait_exit(self) -> int:
        """Until the current core process ends; its exit code (negative: the signal)."""
        assert self._exited is not None, "no core was started"
        return await asyncio.shield(self._exited)

    async def __aenter__(self) -> CoreClient:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _engine_config(self) -> EngineConfig:
        return engine_on(self.config, self.device)

    def _bind(self) -> None:
        self._ipc_dir = tempfile.mkdtemp(prefix=f"voicewire-{self.name}-")
        self._ctx = zmq.asyncio.Context()
        to_core: zmq.Socket[bytes] = zmq.Context.shadow(self._ctx.underlying).socket(zmq.PUSH)
        from_core = self._ctx.socket(zmq.PULL)
        for sock in (to_core, from_core):
            sock.setsockopt(zmq.SNDHWM, 0)
            sock.setsockopt(zmq.RCVHWM, 0)
        to_core.bind(f"ipc://{self._ipc_dir}/to-core")
        from_core.bind(f"ipc://{self._ipc_dir}/from-core")
        self._to_core, self._from_core = to_core, from_core
        self._tasks = [
            asyncio.create_task(self._receive(), name=f"{self.name}-receive"),
            asyncio.create_task(self._report_consumed(), name=f"{self.name}-consumed"),
        ]

    # --- to the core ---------------------------------------------------------------------------
    def _post(self, cmd: StreamCommand) -> None:
        """A Stream's command (push_text, flush, end, cancel) to the core."""
        self._send(cmd)

    def _send(self, msg: ToCore) -> None:
        self._outgoing.put(encode_to_core(msg))  # ValueError here, before anything is sent

    def _send_frames(self, frames: list[bytes]) -> None:
        if self._to_core is None:
            return
        try:
            self._to_core.send_multipart(frames, flags=zmq.NOBLOCK)
        except zmq.Again:
            pass  # no core connected: it is down, and its streams are being ended

    async def _report_consumed(self) -> None:
        while True:
            await asyncio.sleep(CONSUMED_REPORT_S)
            for sid, stream in self._streams.items():
                if not stream.closed and stream.consumed_samples != self._reported[sid]:
                    self._reported[sid] = stream.consumed_samples
                    self._send(Consumed(sid, stream.consumed_samples))

    # --- from the core -------------------------------------------------------------------------
    async def _receive(self) -> None:
        assert self._from_core is not None
        while True:
            frames = await self._from_core.recv_multipart()
            self._t_heard = time.monotonic()
            try:
                messages = decode_all_from_core(frames)
            except Exception:  # one bad batch must not stop audio for every stream
                log.exception("%s: a message from the core could not be read", self.name)
                continue
            for msg in messages:
                try:
                    self._dispatch(msg)
                except Exception:  # one bad message must not stop audio for every stream
                    log.exception("%s: a message from the core could not be handled", self.name)

    def _dispatch(self, msg: object) -> None:
        if isinstance(msg, Audio):
            stream = self._streams.get(msg.stream_id)
            if stream is None:
                return
            if msg.chunk.final:
                self._forget(msg.stream_id)
            if msg.trimmed_samples:
                stream.metrics.trimmed_samples = msg.trimmed_samples
            stream.deliver(msg.chunk)
        elif isinstance(msg, Failed):
            stream = self._forget(msg.stream_id)
            if stream is not None:
                stream.fail(StreamError(msg.code, msg.message))
        elif isinstance(msg, Closed):
            self._forget(msg.stream_id)
        elif isinstance(msg, VoiceCloned | CloneFailed):
            future = self._clones.get(msg.request_id)
            if future is not None and not future.done():
                if isinstance(msg, VoiceCloned):
                    future.set_result(msg.voice)
                else:
                    future.set_exception(_clone_error(msg))
        elif isinstance(msg, Stats):
            self.stats = msg.stats
            self._core_active, self._opened_since_stats = msg.active_streams, 0
        elif isinstance(msg, Ready):
            self._t_heard = time.monotonic()
            self._info, self._max_streams = msg.info, msg.max_streams
            self.state = CoreState.READY
            if self._ready is not None and not self._ready.done():
                self._ready.set_result(None)
        elif isinstance(msg, StartFailed) and self._ready is not None and not self._ready.done():
            self._ready.set_exception(CoreStartFailed(msg.message))

    def _forget(self, sid: int) -> Stream | None:
        self._reported.pop(sid, None)
        return self._streams.pop(sid, None)

    async def _watch(self, process: asyncio.subprocess.Process) -> None:
        """Until the process ends; then end what it held."""
        code = await process.wait()
        self._ended(code, f"signal {-code}" if code < 0 else f"exit code {code}")

    def _ended(self, code: int, how: str) -> None:
        """The core is gone (``how``: for the log and /readyz): end every stream and clone it held."""
        was_ready = self.state is CoreState.READY
        self.last_exit = how
        self._core_active = self._opened_since_stats = 0
        self.state = CoreState.STOPPED if self._closing else CoreState.DOWN
        streams = list(self._streams.values())
        self._streams.clear()
        self._reported.clear()
        if self._closing:
            error = StreamError("engine_closed", "the engine is shutting down")
        else:
            error = StreamError("model_error", f"the engine core died ({self.last_exit})")
            if streams or was_ready:
                log.error(
                    "%s: the engine core died (%s); %d streams ended", self.name, self.last_exit, len(streams)
                )
        for stream in streams:
            stream.fail(error)
        for future in self._clones.values():
            if not future.done():
                future.set_exception(RuntimeError(f"the engine core ended ({self.last_exit})"))
        if self._exited is not None and not self._exited.done():
            self._exited.set_result(code)


def _clone_error(msg: CloneFailed) -> Exception:
    """The exception ``Engine.clone_voice`` would have raised in process."""
    if msg.code == "cloning_not_supported":
        return CloningNotSupported(msg.message)
    if msg.code == "bad_audio":
        return ValueError(msg.message)
    if msg.code == "not_ready":
        return EngineNotReady(msg.message)
    return RuntimeError(msg.message)


def engine_on(config: EngineConfig, device: str) -> EngineConfig:
    """``config`` with its model on ``device`` (where the model takes a device; "": as it is)."""
    if not device or "device" not in config.model_options:
        return config
    return dataclasses.replace(config, model_options={**config.model_options, "device": device})
