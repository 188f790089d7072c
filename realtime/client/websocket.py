"""Protocol v1 over the WebSocket (``GET /v1/stream``): JSON control messages, binary audio."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterable, AsyncIterator, Iterable
from types import TracebackType
from typing import Any

import websockets

from .messages import DEFAULT_SAMPLE_RATE_HZ, ReceivedAudio, VoicewireError
from .protocol import ProtocolClient

MAX_AUDIO_MESSAGE_BYTES = 16 * 1024 * 1024  # a long clause of 48 kHz PCM16 is ~1 MB


class VoicewireClient(ProtocolClient):
    """Protocol v1 over the WebSocket (``GET /v1/stream``)."""

    def __init__(self, ws: Any) -> None:
        super().__init__()
        self._ws = ws
        self._reader: asyncio.Task[None] | None = None
        self.close_code: int | None = None  # the server's close code, once it closed the connection

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        format: str = "pcm16",
        sample_rate_hz: int = DEFAULT_SAMPLE_RATE_HZ,
        voice: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 10.0,
        **ws_options: Any,
    ) -> VoicewireClient:
        """Connect to ``ws://host:port/v1/stream`` (an ``http://host:port`` base works too) and set
        the audio format: ``pcm16`` or ``opus``, 24000 or 48000 Hz. ``api_key``: for a server that
        requires one (``voicewire serve --api-key``), sent as ``Authorization: Bearer``."""
        if api_key:
            ws_options["additional_headers"] = {
                **dict(ws_options.get("additional_headers") or {}),
                "Authorization": f"Bearer {api_key}",
            }
        try:
            ws = await websockets.connect(
                stream_url(url), max_size=MAX_AUDIO_MESSAGE_BYTES, open_timeout=timeout_s, **ws_options
            )
        except websockets.InvalidStatus as err:
            # The server refused the session (auth, capacity, not ready): its JSON error says why.
            raise _refusal(err.response.status_code, err.response.body) from None
        client = cls(ws)
        created = client._expect("session.created")
        client._reader = asyncio.create_task(client._read(), name="voicewire-client-reader")
        try:
            await asyncio.wait_for(created, timeout_s)
            await client._configure(format, sample_rate_hz, voice, timeout_s)
        except BaseException:
            await client.close()
            raise
        return client

    async def _send(self, msg: dict[str, Any]) -> None:
        if self._closed:
            raise VoicewireError("connection_closed", "the connection is closed")
        await self._ws.send(json.dumps(msg, separators=(",", ":"), ensure_ascii=False))

    async def send_raw(self, data: str | bytes) -> None:
        """Send one WebSocket message exactly as given: for tests of malformed input."""
        await self._ws.send(data)

    async def wait_closed(self, timeout_s: float | None = None) -> None:
        """Until the connection is gone (``close_code`` says how the server closed it)."""
        if self._reader is not None:
            await asyncio.wait_for(asyncio.shield(self._reader), timeout_s)

    async def _read(self) -> None:
        reason = "closed by the server"
        try:
            async for raw in self._ws:
                if isinstance(raw, bytes):
                    self._on_audio(
                        ReceivedAudio(raw, self.audio_format, self.sample_rate_hz, time.perf_counter())
                    )
                else:
                    self._on_json(json.loads(raw))
        except websockets.ConnectionClosed as err:
            reason = f"connection closed: {err}"
            self.close_code = err.rcvd.code if err.rcvd is not None else None
        finally:
            self._connection_lost(reason)

    async def close(self) -> None:
        """Close the connection; the server cancels open turns."""
        self._closed = True
        await self._ws.close()
        if self._reader is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader

    async def __aenter__(self) -> VoicewireClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


def stream_url(url: str) -> str:
    """The server's base URL -> its stream URL: ``http(s)://host[:port][/base]`` (or a bare
    ``host:port``) -> ``ws(s)://host[:port][/base]/v1/stream``, for a server under a ``--base-path``
    too. A ``ws://`` or ``wss://`` URL with a path is taken as the stream URL itself."""
    if "://" not in url:
        url = "http://" + url
    url, mark, query = url.partition("?")
    scheme, rest = url.split("://", 1)
    host, _, path = rest.partition("/")
    path = path.rstrip("/")
    if scheme in ("http", "https"):
        scheme = {"http": "ws", "https": "wss"}[scheme]
        if not path.endswith("v1/stream"):
            path = f"{path}/v1/stream".lstrip("/")
    elif not path:
        path = "v1/stream"
    return f"{scheme}://{host}/{path}{mark}{query}"


async def speak(
    url: str, deltas: AsyncIterable[Any] | Iterable[Any], **connect_options: Any
) -> AsyncIterator[ReceivedAudio]:
    """Connect, speak ``deltas``, yield the audio, close: the whole hook in one call."""
    async with await VoicewireClient.connect(url, **connect_options) as client:
        turn = client.speak(deltas)
        try:
            async for chunk in turn:
                yield chunk
        finally:
            if turn.result is None:
                with contextlib.suppress(Exception):
                    await turn.cancel()


def _refusal(status: int, body: bytes | bytearray | None) -> VoicewireError:
    try:
        error = json.loads(body or b"{}")["error"]
        return VoicewireError(str(error["code"]), f"HTTP {status}: {error.get('message', '')}")
    except (ValueError, KeyError, TypeError):
        return VoicewireError(f"http_{status}", f"the server refused the session with HTTP {status}")
