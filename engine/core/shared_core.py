"""A shared engine core's process, as its Ray actor starts and watches it (ray_actor.py).

    gateways ─tcp─▶ the core's PULL / ROUTER (gateways.py): commands in, audio out, no hop between
    actor   ─ipc─▶ the core: Shutdown          core ─ipc─▶ actor: Listening, Ready, StartFailed, Stats

The actor starts the core as ``CoreClient`` does on one host (process.py in a fresh interpreter,
which inherits the actor's ``CUDA_VISIBLE_DEVICES``) with ``CoreSpec.gateways_host`` set: the core
binds its gateways' two TCP sockets itself, on the node's address at ports the OS picks, and says
where (``Listening``) before its model loads. A gateway that starts, restarts or reconnects asks
Ray for them (``CoreEndpoint``), and a core that Ray restarted reports its new ones: gateways come
and go, a core's address is the fixed point. Ray and the actor are the control plane; the audio
goes from the core's loop straight to each gateway's socket.

Once ready, the core sends its starter the heartbeat it sends its gateways (``Stats``, twice a
second). One silent for ``hang_timeout_s`` is stuck, alive (a gateway cannot tell that from a host
gone, nor restart it): it is killed here, and so ends as a crashed one does.
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
from dataclasses import dataclass

import zmq

from voicewire.engine import EngineConfig

from .group import HANG_TIMEOUT_S
from .messages import Listening, Ready, Shutdown, StartFailed, decode_all_from_core, encode_to_core
from .process import CoreSpec

log = logging.getLogger("voicewire.engine.core")

POLL_MS = 100  # how often the actor looks at the core process, at most
LISTEN_TIMEOUT_S = 4.0  # endpoint() waits this long for a starting core to bind (the caller retries)


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


class SharedCore:
    """Start the core process with its gateways' sockets on ``host`` and follow its state on a
    thread of its own. ``on_core_exit(code, was_ready)`` runs on that thread when the process ends."""

    def __init__(
        self,
        engine: EngineConfig,
        host: str,
        name: str,
        on_core_exit: Callable[[int, bool], None],
        hang_timeout_s: float = HANG_TIMEOUT_S,
    ) -> None:
        self.engine = engine
        self.name = name
        self.ready = threading.Event()  # the core sent Ready, or ended before it could
        self.failure: str | None = None  # why it cannot serve (StartFailed, or its exit)
        self._host = host
        self._on_core_exit = on_core_exit
        self._hang_timeout_s = hang_timeout_s
        self._heard_at = 0.0  # when the core last said anything
        self._listening: Listening | None = None
        self._heard = threading.Event()  # Listening came, or the core ended before it
        self._ctx = zmq.Context()
        self._ipc_dir = tempfile.mkdtemp(prefix=f"voicewire-{name}-")
        self._to_core = self._bound(zmq.PUSH, f"ipc://{self._ipc_dir}/to-core")
        self._from_core = self._bound(zmq.PULL, f"ipc://{self._ipc_dir}/from-core")
        self._stopping = threading.Event()
        self._process: subprocess.Popen[bytes] | None = None
        self._thread = threading.Thread(target=self._run, name=f"{name}-watch", daemon=True)
        self.incarnation = f"{os.getpid()}-{time.time_ns()}"

    def _bound(self, kind: int, address: str) -> zmq.Socket[bytes]:
        sock: zmq.Socket[bytes] = self._ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind(address)
        return sock

    def endpoint(self, node: str, node_id: str) -> CoreEndpoint:
        """Where gateways connect; raises while the core has not bound yet (TimeoutError: ask
        again) or when it ended before it did (RuntimeError)."""
        if not self._heard.wait(LISTEN_TIMEOUT_S):
            raise TimeoutError(f"{self.name} is starting and has not bound its sockets yet")
        if self._listening is None:
            raise RuntimeError(f"{self.name} ended before it listened: {self.failure}")
        pid = self._process.pid if self._process is not None else 0
        return CoreEndpoint(
            self._listening.commands,
            self._listening.events,
            self.incarnation,
            node,
            node_id,
            pid,
            self.engine,
        )

    def start(self) -> None:
        spec = CoreSpec(
            engine=self.engine,
            to_core_address=f"ipc://{self._ipc_dir}/to-core",
            from_core_address=f"ipc://{self._ipc_dir}/from-core",
            name=self.name,
            parent_pid=os.getpid(),  # the actor: a core whose actor is gone exits within a second
            sys_path=tuple(sys.path),
            log_level=logging.getLogger().getEffectiveLevel(),
            gateways_host=self._host,
        )
        self._process = subprocess.Popen(
            [sys.executable, "-m", "voicewire.engine.core"], stdin=subprocess.PIPE
        )
        assert self._process.stdin is not None
        self._process.stdin.write(pickle.dumps(spec))
        self._process.stdin.close()
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Shut the core down (its streams end with ``engine_closed``)."""
        self._stopping.set()
        process = self._process
        if process is not None and process.poll() is None:
            self._to_core.send_multipart(encode_to_core(Shutdown()))
            try:
                process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        self._ctx.destroy(linger=0)
        shutil.rmtree(self._ipc_dir, ignore_errors=True)

    def _run(self) -> None:
        assert self._process is not None
        while not self._stopping.is_set():
            if self._from_core.poll(POLL_MS):
                self._drain()
            silent_s = time.monotonic() - self._heard_at
            if self.ready.is_set() and silent_s > self._hang_timeout_s and self._process.poll() is None:
                log.error("%s sent nothing for %.0f s; killing it", self.name, silent_s)
                self._process.kill()
            code = self._process.poll()
            if code is not None:
                self._drain()  # what it said before it ended (a StartFailed)
            if code is not None and not self._stopping.is_set():
                how = f"exit code {code}" if code >= 0 else f"signal {-code}"
                log.error("%s: the engine core process ended (%s)", self.name, how)
                was_ready = self.ready.is_set()
                if self.failure is None:
                    self.failure = f"the engine core exited before it was ready ({how})"
                self._heard.set()
                self.ready.set()
                self._on_core_exit(code, was_ready)
                return

    def _drain(self) -> None:
        while True:
            try:
                messages = decode_all_from_core(self._from_core.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                return
            self._heard_at = time.monotonic()
            for msg in messages:
                if isinstance(msg, Listening):
                    self._listening = msg
                    self._heard.set()
                elif isinstance(msg, Ready):
                    self.ready.set()
                elif isinstance(msg, StartFailed):
                    self.failure = msg.message
