"""One client's share of the server: sessions, speech requests and engine streams per client.

A client is who ``clients.py`` says (an API key, else an address). The server-wide limits
(sessions, speech requests, the engine's streams) protect the server; these protect the other
clients from one heavy one:

* sessions and speech requests at once: a fixed quota per client (by default a quarter of the
  server's limit), so one client cannot hold every slot -> 429 ``quota_exceeded``;
* engine streams: a client alone may use every stream, but while other clients are active each
  client's new turns are admitted only below its fair share (the streams the engine runs / the
  active clients), so a newcomer's turn is admitted before a heavy client's next one ->
  ``share_exceeded`` (a turn's ``error``, 429 on HTTP). The engine's scheduler shares each batch
  out across clients the same way (``StreamParams.tenant``), so a client's streams that are
  behind cannot starve another client's first audio either.

The ledger keeps no label per client in the metrics (an address per series would grow without
bound): ``/metrics`` has the number of active clients, the most streams one holds, and refusals
by quota.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from voicewire.engine import Stream

MIN_SESSION_QUOTA = 8
MIN_SPEECH_QUOTA = 4
MIN_STREAM_SHARE = 4  # a client's fair share never falls below this many streams


@dataclass(frozen=True)
class ClientQuotas:
    """Per-client limits; None: a quarter of the server's own limit (at least the floor above).
    0 turns a quota off."""

    max_sessions: int | None = None  # WebSocket + WebRTC sessions at once -> 429 quota_exceeded
    max_speech_requests: int | None = None  # speech requests streaming at once -> 429 quota_exceeded
    fair_share: bool = True  # engine streams: a fair share while others are active -> share_exceeded

    def __post_init__(self) -> None:
        for name in ("max_sessions", "max_speech_requests"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0 (0: no per-client limit), got {value}")

    def sessions(self, server_limit: int) -> int | None:
        return _quota(self.max_sessions, server_limit, MIN_SESSION_QUOTA)

    def speech_requests(self, server_limit: int) -> int | None:
        return _quota(self.max_speech_requests, server_limit, MIN_SPEECH_QUOTA)


def _quota(value: int | None, server_limit: int, floor: int) -> int | None:
    if value is None:
        return max(floor, server_limit // 4)
    return value or None


@dataclass
class Client:
    """What one client holds now."""

    id: str
    sessions: int = 0
    speech_requests: int = 0
    streams: set[Stream] = field(default_factory=set)  # its turns' and speech requests' engine streams

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
        """Alone (or the only one holding streams) a client may use all of ``capacity``; with
        others active, only below its fair share of it."""
        others = any(c is not client and not c.idle for c in self)
        return not others or client.open_streams() < self.fair_share(capacity)

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
