"""The gateways in front of a shared engine core, on the core's side: two TCP sockets the core binds.

    gateway CoreClient PUSH ─tcp─▶ PULL  commands ─▶ the core's loop (process.py)
    gateway DEALER (id = tag) ◀─tcp─ ROUTER events ◀─ every message for that gateway's streams

Any number of gateways connect (``RemoteCoreClient``, ray_client.py); commands from all of them
arrive on one PULL in the order each sent them. A message about a stream or a clone request goes to
the one gateway whose DEALER has the id's tag as its routing id (``messages.TAG_SHIFT``); the core's
``Ready`` and ``Stats`` go to every attached gateway, and ``Ready`` to each one that attaches later.
A gateway attaches about once a second (``Attach`` on its DEALER); one silent for
``GATEWAY_SILENT_S`` is gone, and the core cancels its streams, so a gateway killed mid-turn leaves
no stream holding a slot. The messages of one pass of the core's loop go to a gateway as one
multipart message (outgoing.py). Audio goes from the core's loop to the gateway's socket with no
process or thread between them: Ray (ray_actor.py) places and restarts the core, but carries none
of this.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import zmq
import zmq.asyncio

from .messages import (
    Audio,
    CloneFailed,
    Closed,
    Failed,
    FromCore,
    Kind,
    Listening,
    Ready,
    VoiceCloned,
    encode_from_core,
    id_tag,
    peek,
)
from .outgoing import Outgoing, sender

log = logging.getLogger("voicewire.engine.core")

GATEWAY_SILENT_S = 5.0  # a gateway that has not attached this long is gone: its streams are cancelled
TAG_BYTES = 4  # a DEALER's routing id: its tag, big-endian (tags are >= 2**30: never a leading zero byte)


def routing_id(tag: int) -> bytes:
    return tag.to_bytes(TAG_BYTES, "big")


class Gateways:
    """The core's two gateway-facing sockets, bound on ``host`` at ports the OS picks."""

    def __init__(self, ctx: zmq.asyncio.Context, host: str) -> None:
        self.commands = _bound(ctx.socket(zmq.PULL), host)
        self._events = _bound(ctx.socket(zmq.ROUTER), host, handover=True)
        self._outgoing = Outgoing(sender(self._events))
        self._heard: dict[bytes, float] = {}  # attached gateway -> when it last attached
        self._ready: list[bytes] | None = None

    def listening(self) -> Listening:
        return Listening(
            self.commands.getsockopt_string(zmq.LAST_ENDPOINT),
            self._events.getsockopt_string(zmq.LAST_ENDPOINT),
        )

    def send(self, msg: FromCore) -> None:
        frames = encode_from_core(msg)
        if isinstance(msg, Audio | Failed | Closed | VoiceCloned | CloneFailed):
            own = msg.request_id if isinstance(msg, VoiceCloned | CloneFailed) else msg.stream_id
            # dropped by the socket when that gateway is gone
            self._outgoing.put(frames, routing_id(id_tag(own)))
            return
        if isinstance(msg, Ready):
            self._ready = frames
        for ident in self._heard:  # Ready, Stats, StartFailed
            self._outgoing.put(frames, ident)

    async def keep(self, cancel_tag: Callable[[int], None]) -> None:
        """Take attaches (answering a new gateway with ``Ready``) and drop silent gateways,
        cancelling their streams (``cancel_tag`` with the gateway's tag)."""
        while True:
            if await self._events.poll(int(GATEWAY_SILENT_S * 1000 / 5)):
                frames = await self._events.recv_multipart()
                ident = frames[0]
                try:
                    kind, _ = peek(frames[1])
                except Exception:  # one bad message must not stop the attaches of every gateway
                    log.warning("a gateway sent the core a message it cannot read", exc_info=True)
                    continue
                if kind is Kind.ATTACH:
                    new = ident not in self._heard
                    self._heard[ident] = time.monotonic()
                    if new and self._ready is not None:
                        self._outgoing.put(self._ready, ident)
            now = time.monotonic()
            for ident, heard in list(self._heard.items()):
                if now - heard > GATEWAY_SILENT_S:
                    del self._heard[ident]
                    cancel_tag(int.from_bytes(ident, "big"))

    def close(self) -> None:
        self._outgoing.flush()
        self.commands.close(linger=0)
        self._events.close(linger=0)


def _bound(sock: zmq.asyncio.Socket, host: str, *, handover: bool = False) -> zmq.asyncio.Socket:
    sock.setsockopt(zmq.SNDHWM, 0)  # flow control is per stream (max_ahead_s), as on one host
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.setsockopt(zmq.LINGER, 0)
    if handover:
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a gateway that reconnects takes its id back
    sock.bind(f"tcp://{host}:*")
    return sock
