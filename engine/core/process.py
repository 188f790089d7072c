"""The engine core: one process that owns an ``Engine`` (model, scheduler, feeders, worker thread)
and serves its streams to one gateway-side ``CoreClient`` over two ZeroMQ sockets, or, as a shared
core (``CoreSpec.gateways_host``: one placed by Ray), to any number of gateways over TCP
(gateways.py) while the two sockets link it to the process that started it.

Inside the core, an asyncio loop stands where the gateway's loop stood for an in-process engine:
it opens the engine's streams, posts the client's commands to them, and forwards every chunk the
moment it arrives. Backpressure crosses the boundary as a number: the client reports how many
samples its caller took (``Consumed``), and the forwarder sets that as the local stream's
``consumed_samples``, so the worker stops a stream exactly ``max_ahead_s`` ahead of the *remote*
caller, as it would in process.

Launched by ``CoreClient`` as ``python -m voicewire.engine.core`` (``main``) with a pickled
``CoreSpec`` on stdin (configuration only: audio and commands use the sockets). It exits on
``Shutdown``, and also when the process that started it is gone (a gateway killed with SIGKILL
must not leave cores holding a GPU).
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import signal
import sys
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, replace
from typing import Any

import zmq
import zmq.asyncio

from voicewire.engine import (
    CloningNotSupported,
    Engine,
    EngineBusy,
    EngineConfig,
    EngineNotReady,
    Stream,
    StreamError,
)
from voicewire.engine.commands import Cancel, End, Flush, PushText

from .gateways import Gateways
from .messages import (
    Audio,
    CloneFailed,
    CloneVoice,
    Closed,
    Consumed,
    Failed,
    FromCore,
    OpenStream,
    Ready,
    Shutdown,
    StartFailed,
    Stats,
    VoiceCloned,
    decode_all_to_core,
    encode_from_core,
    id_tag,
)
from .outgoing import Outgoing, sender

log = logging.getLogger("voicewire.engine.core")

STATS_INTERVAL_S = 0.5  # counters (and the heartbeat) this often
PARENT_CHECK_S = 1.0  # how often the core looks for the process that started it
CORE_FULL_COLLECTION_BUSY_MAX_S = 60.0  # EngineConfig.full_collection_busy_max_s where a config leaves it


@dataclass(frozen=True)
class CoreSpec:
    """What a core needs to start: its engine and the client's two addresses."""

    engine: EngineConfig
    to_core_address: str  # the client binds; the core's PULL connects
    from_core_address: str  # the client binds; the core's PUSH connects
    name: str = "core"
    parent_pid: int = 0  # 0: do not watch the parent
    sys_path: tuple[str, ...] = ()  # the gateway's import path (models given as package.module:factory)
    log_level: int = logging.INFO  # the gateway's: at DEBUG a failed start logs its traceback too
    # a shared core: its gateways' sockets are bound on this address (gateways.py), and the two
    # above carry only the core's own Listening / Ready / StartFailed and the starter's Shutdown
    gateways_host: str = ""


def main() -> None:
    spec = pickle.loads(sys.stdin.buffer.read())
    assert isinstance(spec, CoreSpec)
    sys.path[:0] = [p for p in spec.sys_path if p not in sys.path]
    run_core(spec)


def run_core(spec: CoreSpec) -> None:
    # Ctrl-C reaches the whole process group, and a service manager's SIGTERM may reach the whole
    # control group: the gateway decides when its cores stop (after it drained), and a core whose
    # gateway is gone stops by itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(
        level=min(spec.log_level, logging.INFO), format=f"%(asctime)s %(levelname)s {spec.name} %(message)s"
    )
    asyncio.run(_serve(spec))


async def _serve(spec: CoreSpec) -> None:
    ctx = zmq.asyncio.Context()
    to_core = ctx.socket(zmq.PULL)
    from_core = ctx.socket(zmq.PUSH)
    for sock in (to_core, from_core):
        # Unbounded queues: flow control is per stream (max_ahead_s), a full socket would only
        # stall every stream behind one.
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.setsockopt(zmq.LINGER, 1000)
    to_core.connect(spec.to_core_address)
    from_core.connect(spec.from_core_address)
    gateways = Gateways(ctx, spec.gateways_host) if spec.gateways_host else None

    starter = Outgoing(sender(from_core))

    def to_starter(msg: FromCore) -> None:
        starter.put(encode_from_core(msg))

    config = spec.engine
    if config.full_collection_busy_max_s is None:  # nothing else in this process paces audio
        config = replace(config, full_collection_busy_max_s=CORE_FULL_COLLECTION_BUSY_MAX_S)
    engine = Engine(config)
    core = _Core(engine, to_starter if gateways is None else gateways.send)
    tasks: list[asyncio.Task[None]] = []
    if gateways is not None:
        to_starter(gateways.listening())  # before the model loads: gateways attach meanwhile
        tasks.append(asyncio.create_task(gateways.keep(core.cancel_tagged)))
    try:
        try:
            await asyncio.get_running_loop().run_in_executor(None, engine.start)
        except Exception as err:
            # One line: the gateway ends `voicewire serve` with this message (a bad checkpoint, no
            # CUDA, no memory for a slot are not bugs, and a traceback would bury the reason).
            message = f"{type(err).__name__}: {err}"
            log.error("the engine failed to start: %s", message)
            log.debug("the engine failed to start", exc_info=True)
            if gateways is not None:
                gateways.send(StartFailed(message))
            to_starter(StartFailed(message))
            return
        max_streams = min(engine.config.max_streams, engine.info.max_slots)
        ready = Ready(engine.info, max_streams, os.getpid())
        core.send(ready)
        if gateways is not None:
            to_starter(ready)
        log.info("engine core ready (pid %d, %d streams)", os.getpid(), max_streams)
        # A shared core's starter hears the heartbeat too: a core that hangs alive is killed by it.
        heartbeat = (to_starter,) if gateways is not None else ()
        tasks.append(asyncio.create_task(core.report_stats(*heartbeat)))
        if spec.parent_pid:
            tasks.append(asyncio.create_task(_watch_parent(spec.parent_pid)))
        receive = asyncio.create_task(core.receive(to_core))
        if gateways is not None:
            tasks.append(asyncio.create_task(core.receive(gateways.commands, shutdown=False)))
        await asyncio.wait([receive, *tasks], return_when=asyncio.FIRST_COMPLETED)
        receive.cancel()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.get_running_loop().run_in_executor(None, engine.close)
        starter.flush()  # what the loop put before the close
        to_core.close(linger=0)
        from_core.close()
        if gateways is not None:
            gateways.close()
        ctx.term()


async def _watch_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        await asyncio.sleep(PARENT_CHECK_S)
    log.warning("the gateway process %d is gone; the engine core exits", parent_pid)


class _Core:
    """Streams of one core, keyed by the client's stream ids."""

    def __init__(self, engine: Engine, send: Callable[[FromCore], None]) -> None:
        self.engine = engine
        self.send = send
        self._streams: dict[int, Stream] = {}
        self._consumed: dict[int, int] = {}  # client stream id -> samples its caller took
        self._tasks: set[asyncio.Task[None]] = set()  # forwarders and clones not awaited by anyone

    async def receive(self, sock: zmq.asyncio.Socket, shutdown: bool = True) -> None:
        """Until ``Shutdown`` (``shutdown``: from this socket; a shared core's gateways cannot stop
        what others front): one command at a time, in the order each client sent them."""
        while True:
            frames = await sock.recv_multipart()
            try:
                messages = decode_all_to_core(frames)
            except Exception:  # one bad batch must not stop the streams of every client
                log.exception("a message to the core could not be read")
                continue
            for msg in messages:
                if isinstance(msg, Shutdown):
                    if shutdown:
                        return
                elif isinstance(msg, OpenStream):
                    self._open(msg)
                elif isinstance(msg, Consumed):
                    self._consume(msg)
                elif isinstance(msg, CloneVoice):
                    self._spawn(self._clone(msg))
                else:
                    self._command(msg)

    async def _clone(self, msg: CloneVoice) -> None:
        """On the engine's clone thread: commands and audio keep flowing meanwhile."""
        rid = msg.request_id
        try:
            voice = await self.engine.clone_voice(msg.pcm, msg.sample_rate_hz, msg.ref_text)
        except CloningNotSupported as err:
            self.send(CloneFailed(rid, "cloning_not_supported", str(err)))
        except ValueError as err:
            self.send(CloneFailed(rid, "bad_audio", str(err)))
        except EngineNotReady as err:
            self.send(CloneFailed(rid, "not_ready", str(err)))
        except Exception as err:  # the model failed: this request, not the core
            log.exception("cloning a voice failed")
            self.send(CloneFailed(rid, "model_error", f"{type(err).__name__}: {err}"))
        else:
            self.send(VoiceCloned(rid, voice))

    def _open(self, msg: OpenStream) -> None:
        # An open past the engine's limit waits in the engine's own queue (EngineConfig.max_queued_streams);
        # the client counts the same limit, so EngineBusy here means a client and core disagree.
        sid = msg.stream_id
        try:
            stream = self.engine.open_stream(msg.params)
        except (EngineBusy, ValueError, EngineNotReady) as err:
            code = (
                "server_busy"
                if isinstance(err, EngineBusy)
                else "bad_request"
                if isinstance(err, ValueError)
                else "not_ready"
            )
            self.send(Failed(sid, code, str(err)))
            return
        self._streams[sid] = stream
        self._spawn(self._forward(sid, stream))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _command(self, msg: PushText | Flush | End | Cancel) -> None:
        stream = self._streams.get(msg.stream_id)
        if stream is None:
            return  # finished already (a cancel racing the final chunk)
        try:
            if isinstance(msg, PushText):
                stream.push_text(msg.delta)
            elif isinstance(msg, Flush):
                stream.flush()
            elif isinstance(msg, End):
                stream.end()
            else:
                stream.cancel()
        except StreamError as err:  # text after end: the client checks this too, so it is rare
            stream.fail(err)

    def cancel_tagged(self, tag: int) -> None:
        """A shared core's gateway went silent: its streams are cancelled, their slots freed."""
        gone = [sid for sid in self._streams if id_tag(sid) == tag]
        if gone:
            log.warning("a gateway went silent; cancelling its %d streams", len(gone))
        for sid in gone:
            self._command(Cancel(sid))

    def _consume(self, msg: Consumed) -> None:
        stream = self._streams.get(msg.stream_id)
        if stream is not None:
            self._consumed[msg.stream_id] = msg.samples
            stream.consumed_samples = msg.samples

    async def _forward(self, sid: int, stream: Stream) -> None:
        """Every chunk to the client as it comes; exactly one ending message per stream."""
        try:
            async for chunk in stream:
                # The local iterator counts what it forwarded as consumed; what bounds generation
                # is what the remote caller consumed.
                stream.consumed_samples = self._consumed.get(sid, 0)
                self.send(Audio(sid, chunk, stream.metrics.trimmed_samples))
            if stream.cancelled:
                self.send(Closed(sid))
        except StreamError as err:
            self.send(Failed(sid, err.code, str(err)))
        finally:
            self._streams.pop(sid, None)
            self._consumed.pop(sid, None)

    async def report_stats(self, *also: Callable[[FromCore], None]) -> None:
        """The counters every ``STATS_INTERVAL_S`` to the clients, and to ``also``."""
        while True:
            stats = Stats(self.engine.stats, self.engine.active_streams())
            for send in (self.send, *also):
                send(stats)
            await asyncio.sleep(STATS_INTERVAL_S)
