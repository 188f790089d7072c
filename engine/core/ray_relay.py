"""The relay in front of a shared engine core: any number of gateways over TCP, one core over ipc.

    gateway CoreClient PUSH ─tcp─▶ PULL commands ─┐             ┌─▶ ipc PUSH ─▶ core PULL
                                                  ├─ relay thread┤
    gateway DEALER (id = tag) ◀─tcp─ ROUTER events ◀─────────────┘◀─ ipc PULL ◀─ core PUSH

The core is the process ``CoreClient`` starts on one host (process.py, as it is: it serves one
peer); the relay makes it one that many gateways front, and lives where the core lives (in its
Ray actor, ray_actor.py). Frames pass through as they came: the relay reads each message's header
(``messages.peek``) and nothing else. Stream and request ids carry their gateway's tag
(``messages.TAG_SHIFT``), so a message about a stream goes to the one gateway whose DEALER has
that tag as its routing id; the core's heartbeat (``Stats``: its load) and ``Ready`` go to every
attached gateway. A gateway that stops attaching (``Attach``, once a second) for
``GATEWAY_SILENT_S`` has its streams cancelled, so a gateway killed mid-turn leaves no stream
holding a slot.

Both TCP sockets are bound here, on the node's address, at ports the OS picks, and the actor
reports them (``CoreEndpoint``): a gateway that starts, restarts or reconnects asks Ray for them,
and a core that Ray restarted reports its new ones. Gateways come and go; a core's address is the
fixed point.
"""

from __future__ import annotations

import logging
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import zmq

from voicewire.engine import EngineConfig
from voicewire.engine.commands import Cancel

from .messages import Kind, Shutdown, encode_to_core, id_tag, peek
from .process import CoreSpec

log = logging.getLogger("voicewire.engine.core")

POLL_MS = 100  # how often the relay looks at the core process and at silent gateways, at most
GATEWAY_SILENT_S = 5.0  # a gateway that has not attached this long is gone: its streams are cancelled
TAG_BYTES = 4  # a DEALER's routing id: its tag, big-endian (tags are >= 2**30: never a leading zero byte)
_TO_GATEWAY = {Kind.AUDIO, Kind.FAILED, Kind.CLOSED, Kind.CLONED, Kind.CLONE_FAILED}
_TO_EVERY_GATEWAY = {Kind.READY, Kind.STATS, Kind.START_FAILED}


def routing_id(tag: int) -> bytes:
    return tag.to_bytes(TAG_BYTES, "big")


@dataclass(frozen=True)
class CoreEndpoint:
    """Where a gateway reaches one incarnation of a shared core, and what it serves."""

    commands: str  # tcp://host:port: the gateway's PUSH connects here
    events: str  # tcp://host:port: the gateway's DEALER connects here
    incarnation: str  # changes whenever the core (re)starts
    node: str  # the node's address
    node_id: str  # Ray's id of the node
    pid: int  # the core process
    engine: EngineConfig  # the core's configuration (a gateway admits by its limits)


@dataclass
class _Gateway:
    heard_s: float
    streams: set[int] = field(default_factory=set)  # open on the core


class Relay:
    """Start the core process, bind the gateway-facing sockets, relay on a thread of its own.

    ``on_core_exit(code, was_ready)`` runs on the relay thread when the core process ends."""

    def __init__(
        self, engine: EngineConfig, host: str, name: str, on_core_exit: Callable[[int, bool], None]
    ) -> None:
        self.engine = engine
        self.name = name
        self.ready = threading.Event()  # the core sent Ready
        self.failure: str | None = None  # the core's StartFailed message
        self._on_core_exit = on_core_exit
        self._ctx = zmq.Context()
        self._ipc_dir = tempfile.mkdtemp(prefix=f"voicewire-{name}-")
        self._to_core = self._socket(zmq.PUSH, f"ipc://{self._ipc_dir}/to-core")
        self._from_core = self._socket(zmq.PULL, f"ipc://{self._ipc_dir}/from-core")
        self._commands = self._socket(zmq.PULL, f"tcp://{host}:*")
        self._events = self._socket(zmq.ROUTER, f"tcp://{host}:*", handover=True)
        self._gateways: dict[bytes, _Gateway] = {}
        self._ready_frames: list[bytes] | None = None
        self._stopping = threading.Event()
        self._process: subprocess.Popen[bytes] | None = None
        self._thread = threading.Thread(target=self._run, name=f"{name}-relay", daemon=True)
        self.incarnation = f"{os.getpid()}-{time.time_ns()}"

    def _socket(self, kind: int, address: str, *, handover: bool = False) -> zmq.Socket[bytes]:
        sock: zmq.Socket[bytes] = self._ctx.socket(kind)
        sock.setsockopt(zmq.SNDHWM, 0)  # flow control is per stream (max_ahead_s), as on one host
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.setsockopt(zmq.LINGER, 0)
        if handover:
            sock.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a gateway that reconnects takes its id back
        sock.bind(address)
        return sock

    def endpoint(self, node: str, node_id: str) -> CoreEndpoint:
        pid = self._process.pid if self._process is not None else 0
        commands = self._commands.getsockopt_string(zmq.LAST_ENDPOINT)
        events = self._events.getsockopt_string(zmq.LAST_ENDPOINT)
        return CoreEndpoint(commands, events, self.incarnation, node, node_id, pid, self.engine)

    def start(self) -> None:
        """Start the core process (a fresh interpreter, as ``CoreClient`` does) and the relay."""
        spec = CoreSpec(
            engine=self.engine,
            to_core_address=f"ipc://{self._ipc_dir}/to-core",
            from_core_address=f"ipc://{self._ipc_dir}/from-core",
            name=self.name,
            parent_pid=os.getpid(),  # the actor: a core whose actor is gone exits within a second
            sys_path=tuple(sys.path),
            log_level=logging.getLogger().getEffectiveLevel(),
        )
        self._process = subprocess.Popen([sys.executable, "-m", "voicewire.engine.core"], stdin=subprocess.PIPE)
        assert self._process.stdin is not None
        self._process.stdin.write(pickle.dumps(spec))
        self._process.stdin.close()
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Shut the core down (its streams end with ``engine_closed``), then the relay."""
        process = self._process
        if process is not None and process.poll() is None:
            self._stopping.set()
            self._thread.join(timeout_s)
            self._to_core.send_multipart(encode_to_core(Shutdown()))
            try:
                process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        self._ctx.destroy(linger=0)
        shutil.rmtree(self._ipc_dir, ignore_errors=True)

    # --- the relay thread ------------------------------------------------------------------------
    def _run(self) -> None:
        poller = zmq.Poller()
        for sock in (self._from_core, self._commands, self._events):
            poller.register(sock, zmq.POLLIN)
        t_check = time.monotonic()
        while not self._stopping.is_set():
            ready = dict(poller.poll(POLL_MS))
            if self._from_core in ready:
                self._drain(self._from_core, self._from_core_message)
            if self._commands in ready:
                self._drain(self._commands, self._command)
            if self._events in ready:
                self._drain(self._events, self._attach)
            now = time.monotonic()
            if now - t_check >= POLL_MS / 1000:
                t_check = now
                self._drop_silent(now)
                assert self._process is not None
                code = self._process.poll()
                if code is not None and not self._stopping.is_set():
                    self._from_core_exit(code)
                    return

    @staticmethod
    def _drain(sock: zmq.Socket[bytes], handle: Callable[[list[bytes]], None]) -> None:
        while True:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                handle(frames)
            except Exception:  # one bad message must not stop the relay for every stream
                log.exception("relay %s: a message could not be relayed", threading.current_thread().name)

    def _from_core_message(self, frames: list[bytes]) -> None:
        kind, fields = peek(frames[0])
        if kind in _TO_GATEWAY:
            sid = fields[0]
            ident = routing_id(id_tag(sid))
            gateway = self._gateways.get(ident)
            ended = kind in (Kind.FAILED, Kind.CLOSED) or (kind is Kind.AUDIO and fields[3])  # final
            if gateway is not None and ended:
                gateway.streams.discard(sid)
            self._events.send_multipart([ident, *frames], copy=False)
        elif kind in _TO_EVERY_GATEWAY:
            if kind is Kind.READY:
                self._ready_frames = frames
                self.ready.set()
            elif kind is Kind.START_FAILED:
                self.failure = str(fields[0])
            for ident in self._gateways:
                self._events.send_multipart([ident, *frames], copy=False)

    def _command(self, frames: list[bytes]) -> None:
        kind, fields = peek(frames[0])
        if kind is Kind.OPEN:
            gateway = self._gateways.get(routing_id(id_tag(fields[0])))
            if gateway is not None:
                gateway.streams.add(fields[0])
        elif kind is Kind.SHUTDOWN:
            return  # a core's life is its actor's: one gateway cannot stop what others front
        self._to_core.send_multipart(frames, copy=False)

    def _attach(self, frames: list[bytes]) -> None:
        ident, body = frames[0], frames[1]
        kind, _ = peek(body)
        if kind is not Kind.ATTACH:
            return
        gateway = self._gateways.get(ident)
        if gateway is None:
            self._gateways[ident] = _Gateway(time.monotonic())
            if self._ready_frames is not None:
                self._events.send_multipart([ident, *self._ready_frames], copy=False)
        else:
            gateway.heard_s = time.monotonic()

    def _drop_silent(self, now: float) -> None:
        for ident, gateway in list(self._gateways.items()):
            if now - gateway.heard_s > GATEWAY_SILENT_S:
                if gateway.streams:
                    log.warning("%s: a gateway went silent; cancelling its %d streams", self.name, len(gateway.streams))
                for sid in gateway.streams:
                    self._to_core.send_multipart(encode_to_core(Cancel(sid)))
                del self._gateways[ident]

    def _from_core_exit(self, code: int) -> None:
        log.error("%s: the engine core process ended (%s)", self.name, f"exit code {code}" if code >= 0 else f"signal {-code}")
        self._on_core_exit(code, self.ready.is_set())
