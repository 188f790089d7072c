"""The gateway side of a shared engine core (a Ray actor, ray_actor.py), over TCP.

A ``CoreClient`` whose core it neither starts nor owns: ``start()`` asks where the core is (its
``CoreEndpoint``, from Ray), connects a PUSH for commands and a DEALER for everything the core
sends this gateway (its routing id is the client's tag, which every stream and request id
carries), attaches, and waits for the core's ``Ready``. Streams, admission, backpressure and
cloning are the base class's; admission counts the core's reported load (``shared``), since other
gateways hold streams there too.

The link is watched three ways, the first to fire wins: the DEALER's disconnect event (a dead
actor's host closes its sockets: at once), ZeroMQ heartbeats (a host that vanished: within
``HEARTBEAT_TIMEOUT_MS``) and the core's own heartbeat (``Stats`` twice a second: none for
``LINK_SILENT_S``). Then every stream the core held ends with ``model_error``, the client is
``DOWN``, and the next ``start()`` finds the core's new incarnation (``RayCores`` does that).
``close()`` leaves the core running: it is not this gateway's to stop.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from voicewire.engine import EngineConfig

from .client import CoreClient, CoreStartFailed, CoreState
from .gateways import routing_id
from .messages import TAG_SHIFT, Attach, encode_attach
from .shared_core import CoreEndpoint

log = logging.getLogger("voicewire.engine.core")

ATTACH_S = 1.0  # the core drops a gateway silent for GATEWAY_SILENT_S (5 s, gateways.py)
HEARTBEAT_IVL_MS = 1000
HEARTBEAT_TIMEOUT_MS = 3000
LINK_SILENT_S = 3.0  # the core's Stats come every 0.5 s
RECONNECT_BACKOFF_S = 0.5  # then doubles, to RECONNECT_MAX_BACKOFF_S: whoever restarts the core is not us
RECONNECT_MAX_BACKOFF_S = 5.0


class RemoteCoreClient(CoreClient):
    shared = True

    def __init__(self, name: str, locate: Callable[[], Awaitable[CoreEndpoint]]) -> None:
        super().__init__(EngineConfig(), name=name)
        self.tag = random.randrange(2**30, 2**31)
        self._ids = itertools.count((self.tag << TAG_SHIFT) + 1)
        self._locate = locate
        self.endpoint: CoreEndpoint | None = None
        self._gone: str | None = None  # the incarnation that went down: not to be reconnected to
        self._link: list[asyncio.Task[None]] = []
        self._events: zmq.asyncio.Socket | None = None
        self._monitor: zmq.asyncio.Socket | None = None

    @property
    def pid(self) -> int | None:
        return self.endpoint.pid if self.endpoint is not None else None

    @property
    def node(self) -> str | None:
        return self.endpoint.node if self.endpoint is not None else None

    async def start(self) -> RemoteCoreClient:
        """Connect to the core's current incarnation and wait until it is ready. Raises
        CoreStartFailed (not found, not restarted yet, or its model failed)."""
        if self.state in (CoreState.STARTING, CoreState.READY):
            return self
        loop = asyncio.get_running_loop()
        try:
            endpoint = await self._locate()
        except Exception as err:
            raise CoreStartFailed(f"{self.name} cannot be located: {type(err).__name__}: {err}") from err
        if endpoint.incarnation == self._gone:
            raise CoreStartFailed(f"{self.name} has not been restarted yet")
        self.endpoint, self.config = endpoint, endpoint.engine
        self.state = CoreState.STARTING
        self._ready, self._exited = loop.create_future(), loop.create_future()
        self._connect(endpoint)
        if self._starts:
            self.restarts += 1
        self._starts += 1
        ready, exited = self._ready, self._exited
        either: list[asyncio.Future[Any]] = [ready, exited]
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        if ready.done() and ready.exception() is None:
            return self
        self._disconnect()
        if not exited.done():
            self._ended(1, "its model failed to start")
        raise (ready.exception() if ready.done() else None) or CoreStartFailed(
            f"{self.name} went down before it was ready ({self.last_exit})"
        )

    async def stay_connected(self, closing: Callable[[], bool]) -> None:
        """Connect, and reconnect whenever the core goes down (its owner restarts it meanwhile:
        Ray, or ``voicewire serve``'s supervisor), until ``closing()``."""
        backoff_s = RECONNECT_BACKOFF_S
        while not closing():
            try:
                await self.start()
            except CoreStartFailed as err:
                log.debug("%s: %s", self.name, err)
                await asyncio.sleep(backoff_s)
                backoff_s = min(2 * backoff_s, RECONNECT_MAX_BACKOFF_S)
                continue
            backoff_s = RECONNECT_BACKOFF_S
            t_up = time.monotonic()
            log.info("%s is ready (node %s, pid %s)", self.name, self.node, self.pid)
            await self.wait_exit()
            if not closing():
                log.warning(
                    "%s is down after %.0f s (%s); reconnecting once it is restarted",
                    self.name, time.monotonic() - t_up, self.last_exit,
                )  # fmt: skip

    async def close(self) -> None:
        """Disconnect; this gateway's streams end with ``engine_closed``. The core keeps running."""
        self._closing = True
        self._disconnect()
        self._ended(0, "closed")
        for task in self._tasks:
            task.cancel()
        self._tasks.clear()
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None
        self.state = CoreState.STOPPED
        self._closing = False

    # --- the link ------------------------------------------------------------------------------
    def _connect(self, endpoint: CoreEndpoint) -> None:
        if self._ctx is None:
            self._ctx = zmq.asyncio.Context()
            self._tasks = [asyncio.create_task(self._report_consumed(), name=f"{self.name}-consumed")]
        to_core: zmq.Socket[bytes] = zmq.Context.shadow(self._ctx.underlying).socket(zmq.PUSH)
        events = self._ctx.socket(zmq.DEALER)
        events.setsockopt(zmq.ROUTING_ID, routing_id(self.tag))
        for sock in (to_core, events):
            sock.setsockopt(zmq.SNDHWM, 0)
            sock.setsockopt(zmq.RCVHWM, 0)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
            sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
        self._monitor = events.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        to_core.connect(endpoint.commands)
        events.connect(endpoint.events)
        self._to_core, self._from_core, self._events = to_core, events, events
        self._t_heard = time.monotonic()
        self._link = [
            asyncio.create_task(self._receive(), name=f"{self.name}-receive"),
            asyncio.create_task(self._attach(events), name=f"{self.name}-attach"),
            asyncio.create_task(self._watch_link(endpoint), name=f"{self.name}-link"),
        ]

    def _disconnect(self) -> None:
        current = asyncio.current_task()
        for task in self._link:
            if task is not current:
                task.cancel()
        self._link.clear()
        if self._events is not None:
            self._events.disable_monitor()
        for sock in (self._monitor, self._to_core, self._events):
            if sock is not None:
                sock.close(linger=0)
        self._monitor = self._to_core = self._from_core = self._events = None

    async def _attach(self, events: zmq.asyncio.Socket) -> None:
        while True:
            await events.send_multipart(encode_attach(Attach(self.tag)))
            await asyncio.sleep(ATTACH_S)

    async def _watch_link(self, endpoint: CoreEndpoint) -> None:
        assert self._monitor is not None
        monitor = self._monitor
        receive = asyncio.ensure_future(monitor.recv_multipart())
        try:
            while True:
                done, _ = await asyncio.wait([receive], timeout=0.5)
                if done:
                    event = parse_monitor_message(receive.result())
                    if event["event"] == zmq.EVENT_DISCONNECTED:
                        how = "the connection to it was lost"
                        break
                    receive = asyncio.ensure_future(monitor.recv_multipart())
                if self.state is CoreState.READY and self.silent_s() > LINK_SILENT_S:
                    how = f"no heartbeat for {self.silent_s():.1f} s"
                    break
        finally:
            receive.cancel()
        self._gone = endpoint.incarnation
        self._disconnect()
        self._ended(-1, how)
