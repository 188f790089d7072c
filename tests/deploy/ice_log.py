"""A STUN/TURN endpoint on 127.0.0.1 that records who asked it what, for tests that check which
ICE servers a browser and the gateway's aiortc peers really use, without any packet leaving the
host (no STUN or TURN server runs here, and a public one must not be contacted).

Binding requests get a success answer mapping the sender to ``MAPPED_HOST`` (a loopback address
no peer listens on, so the server-reflexive candidate is visibly new and checks to it stay on
``lo``). TURN Allocate requests get the long-term-credential challenge (401 with a realm and
nonce); the retry, which carries the client's USERNAME, is refused with 403, so both clients give
up on TURN at once and gathering completes. It runs in a thread: the gateway (another process)
and the browser use it while the tests' event loops come and go.
"""

from __future__ import annotations

import contextlib
import secrets
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

from aioice import stun

MAPPED_HOST = "127.0.0.9"


@dataclass
class IceLog:
    port: int
    binding_from: list[tuple[str, int]] = field(default_factory=list)  # senders of Binding requests
    turn_usernames: list[str] = field(default_factory=list)  # USERNAME of authenticated Allocates

    def answer(self, data: bytes, addr: tuple[str, int]) -> bytes | None:
        try:
            request = stun.parse_message(data)
        except ValueError:
            return None
        if request.message_class != stun.Class.REQUEST:
            return None
        response = stun.Message(
            message_method=request.message_method,
            message_class=stun.Class.RESPONSE,
            transaction_id=request.transaction_id,
        )
        if request.message_method == stun.Method.BINDING:
            self.binding_from.append(addr)
            response.attributes["XOR-MAPPED-ADDRESS"] = (MAPPED_HOST, addr[1])
        elif request.message_method == stun.Method.ALLOCATE:
            response.message_class = stun.Class.ERROR
            if "USERNAME" in request.attributes:
                self.turn_usernames.append(request.attributes["USERNAME"])
                response.attributes["ERROR-CODE"] = (403, "Forbidden")
            else:
                response.attributes["ERROR-CODE"] = (401, "Unauthorized")
                response.attributes["REALM"] = "voicewire-test"
                response.attributes["NONCE"] = secrets.token_hex(8).encode()
        else:
            return None
        response.add_fingerprint()
        return bytes(response)


@contextlib.contextmanager
def ice_log() -> Iterator[IceLog]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(0.1)
    log = IceLog(port=sock.getsockname()[1])
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                data, addr = sock.recvfrom(2048)
            except TimeoutError:
                continue
            except OSError:  # ICMP errors of earlier answers surface here on Linux
                continue
            reply = log.answer(data, addr)
            if reply is not None:
                with contextlib.suppress(OSError):
                    sock.sendto(reply, addr)

    thread = threading.Thread(target=serve, name="ice-log", daemon=True)
    thread.start()
    try:
        yield log
    finally:
        stop.set()
        thread.join(2)
        sock.close()
