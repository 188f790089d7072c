"""One client's share of the server: sessions, speech requests and engine streams per client.

A client is the API key a request presented (a digest of it: the key itself never sits in these
tables), else the address it comes from (behind ``--trusted-proxy``, the forwarded client's:
``proxy.py``). A session token carries no owner, so the browsers of one backend are told apart
by address; with auth off a key costs nothing to invent, so it cannot buy a fresh quota. The
server-wide limits
(sessions, speech requests, the engine's streams) protect the server; these protect the other
clients from one heavy one:

* sessions and speech requests at once: a fixed quota per client (by default a quarter of the
  server's limit), so one client cannot hold every slot -> 429 ``quota_exceeded``;
* engine streams: a client alone may use every stream but an eighth (kept for whoever comes
  next), and while other clients are active each client's new turns are admitted only below its
  fair share (the streams the engine runs / the active clients), so a newcomer's turn is
  admitted before a heavy client's next one ->
  ``share_exceeded`` (a turn's ``error``, 429 on HTTP). The engine's scheduler shares each batch
  out across clients the same way (``StreamParams.tenant``), so a client's streams that are
  behind cannot starve another client's first audio either.

The ledger keeps no label per client in the metrics (an address per series would grow without
bound): ``/metrics`` has the number of active clients, the most streams one holds, and refusals
by quota.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from voicewire.engine import Stream

from .auth import api_key_from_headers, token_from_request
from .proxy import client_address

MIN_STREAM_SHARE = 4  # a client's fair share never falls below this many streams


def reserve(capacity: int) -> int:
    """Streams a client alone leaves free for the next client to arrive: an eighth."""
    return min(capacity - 1, max(1, capacity // 8)) if capacity > 1 else 0


def client_id(request: web.BaseRequest, auth_enabled: bool) -> str:
    """``key:<digest>`` for a request that presents an API key while auth is on (admission has
    checked it), ``addr:<address>`` otherwise."""
    if auth_enabled and token_from_request(request.query, request.headers) is None:
        key = api_key_from_headers(request.headers)
        if key:
            return f"key:{hashlib.sha256(key.encode('utf-8', 'surrogateescape')).hexdigest()[:16]}"
    return f"addr:{client_address(request)}"


@dataclass
class Client:
    """What one client holds now."""

    id: str
    sessions: int = 0
    speech_requests: int = 0
    streams: set[Stream] = field(default_factory=set)  # its turns' and speech requests' engine streams
    # by kind: its holds in the count the port's gateway processes share (peer_holds.py)
    peer_holds: dict[str, list[Path]] = field(default_factory=dict)

    def open_streams(self) -> int:
        self.streams = {s for s in self.streams if not s.closed}
        return len(self.streams)

    @property
    def idle(self) -> bool:
        return not self.sessions and not self.speech_requests and not self.open_streams()


class ClientLedger:
    """The clients holding anything, each with its holdings; a client is forgotten when idle."""

    def __init__(self) -> None:
        self._clients: dict[str, Client] = {}

    def get(self, client_id: str) -> Client:
        client = self._clients.get(client_id)
        if client is None:
            client = self._clients[client_id] = Client(client_id)
        return client

    def release(self, client: Client) -> None:
        """Forget ``client`` if it holds nothing (call after giving something back)."""
        if client.idle and self._clients.get(client.id) is client:
            del self._clients[client.id]

    def __iter__(self) -> Iterator[Client]:
        return iter(list(self._clients.values()))

    def active(self) -> int:
        return sum(1 for c in self if not c.idle)

    def fair_share(self, capacity: int) -> int:
        """The streams one client may hold while others are active."""
        return max(MIN_STREAM_SHARE, -(-capacity // max(1, self.active())))

    def may_open_stream(self, client: Client, capacity: int) -> bool:
        """Alone a client may use all of ``capacity`` but a reserve, which keeps a newcomer's
        first turn from waiting behind it; with others active, only below its fair share."""
        others = any(c is not client and not c.idle for c in self)
        limit = self.fair_share(capacity) if others else capacity - reserve(capacity)
        return client.open_streams() < limit

    def most_streams(self) -> int:
        return max((c.open_streams() for c in self), default=0)


class StreamShare:
    """A session's or speech request's side of its client's stream share: the check before a
    stream opens, the tenant it opens as, and the stream counted once open."""

    def __init__(
        self, ledger: ClientLedger, client: Client, capacity: Callable[[], int], enabled: bool
    ) -> None:
        self._ledger, self.client, self._capacity, self._enabled = ledger, client, capacity, enabled

    @property
    def tenant(self) -> str:
        return self.client.id

    def admit(self) -> bool:
        return not self._enabled or self._ledger.may_open_stream(self.client, self._capacity())

    def hold(self, stream: Stream) -> None:
        self.client.streams.add(stream)
