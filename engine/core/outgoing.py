"""Messages put on one side of the core boundary during a pass of the event loop, sent when the pass
ends as one ZeroMQ multipart message a destination.

Under load a core forwards a chunk for tens of streams each time a piece of codec work ends, and a
gateway sends a command for every word of every streamed turn: each as its own message costs a
socket call (a release of the interpreter's lock, a wake-up of ZeroMQ's I/O thread) on the sending
side and a receive on the other, on the same threads that pace audio and step the model. Put
together, the messages of one pass cost one send and one receive. The send is a callback the loop
runs right after those already queued, with no wait for I/O in between (``loop.call_soon``).

A batch is the messages' frames one after another (messages.py says how many frames each kind
has); a message for a ROUTER's peer carries the peer's routing id once, in front.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import zmq
import zmq.asyncio

Send = Callable[[list[bytes]], None]  # one multipart message, routing id first where there is one


class Outgoing:
    """Owned by one event loop; ``put`` only from it."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self._pending: dict[bytes, list[bytes]] = {}  # routing id (b"" for a socket with one peer) -> frames
        self._scheduled = False

    def put(self, frames: list[bytes], to: bytes = b"") -> None:
        pending = self._pending.get(to)
        if pending is None:
            self._pending[to] = pending = [to] if to else []
        pending.extend(frames)
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        """Send what was put (also before a socket closes)."""
        self._scheduled = False
        pending, self._pending = self._pending, {}
        for frames in pending.values():
            self._send(frames)


def sender(sock: zmq.asyncio.Socket) -> Send:
    """Sends on ``sock`` without waiting (its queue has no limit). A message that no peer can take
    is dropped: a ROUTER's peer that is gone, or a PUSH's only peer."""
    sync: zmq.Socket[bytes] = zmq.Socket.shadow(sock.underlying)

    def send(frames: list[bytes]) -> None:
        try:
            sync.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            pass

    return send
