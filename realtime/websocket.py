"""WebSocket transport: ``GET /v1/stream`` speaks protocol v1; audio goes out as binary messages."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from aiohttp import WSMsgType, web

from voicewire.engine import AudioChunk

from .audio import TurnAudioEncoder
from .auth import TOKEN_SUBPROTOCOL_PREFIX
from .gateway import GATEWAY, Gateway, bound_send_buffer
from .protocol import MAX_MESSAGE_BYTES, dumps
from .quotas import Client
from .session import Session
from .truncation import SpokenWord
from .turn import SinkStalled, Turn

log = logging.getLogger("voicewire.ws")

# Close codes (README, "Security and limits").
CLOSE_SESSION_EXPIRED = 4001
CLOSE_IDLE = 4002
CLOSE_SLOW_CONSUMER = 4008
CLOSE_DRAINING = 1001  # going away: the server is shutting down
WATCHDOG_INTERVAL_S = 1.0
# A closing handshake waits this long for the client's reply. A slow consumer gets its close frame
# behind the audio already buffered for it, and must read all of that first; meanwhile the server
# keeps reading (so the client's pings never sit unread, which would turn our close into a reset).
CLOSE_HANDSHAKE_TIMEOUT_S = 60.0
CLOSE_REPLY_TIMEOUT_S = 5.0


class WebSocketSink:
    """Session output over one WebSocket. Sends are serialized so JSON and audio keep their order."""

    def __init__(self, ws: web.WebSocketResponse, engine_rate_hz: int, stall_timeout_s: float = 10.0) -> None:
        self._ws = ws
        self._lock = asyncio.Lock()
        self._stall_timeout_s = stall_timeout_s
        self._rate = engine_rate_hz
        self._encoders: dict[int, TurnAudioEncoder] = {}

    played_source = "sent"  # the server knows what it sent, not what played (turn.cancel may say)

    async def send_json(self, msg: dict[str, Any]) -> None:
        async with self._lock:
            if not self._ws.closed:
                await self._guarded(self._ws.send_str(dumps(msg)))

    async def send_words(self, turn: Turn, words: list[SpokenWord]) -> None:
        # Before the chunk's binary messages, in the same ordered stream of sends.
        described = [w.describe(self._rate) for w in words]
        await self.send_json({"type": "turn.words", "turn_id": turn.turn_id, "words": described})

    async def start_turn(self, turn: Turn) -> None:
        self._encoders[id(turn)] = TurnAudioEncoder(turn.audio.format, self._rate, turn.audio.sample_rate)

    async def send_audio(self, turn: Turn, chunk: AudioChunk) -> None:
        enc = self._encoders[id(turn)]
        await self._send_binary(enc.push(chunk.pcm) if chunk.pcm.size else [])

    async def end_turn(self, turn: Turn, cancelled: bool) -> float:
        enc = self._encoders.pop(id(turn), None)
        if enc is not None and not cancelled:
            await self._send_binary(enc.flush())
        # Over a WebSocket the server knows what it sent, not what played.
        return turn.samples_sent * 1000 / self._rate

    async def _send_binary(self, payloads: list[bytes]) -> None:
        if not payloads:
            return
        async with self._lock:
            for p in payloads:
                if self._ws.closed:
                    return
                await self._guarded(self._ws.send_bytes(p))

    async def _guarded(self, send: Any) -> None:
        # A send blocks only when the socket's buffers are full: the client stopped reading.
        try:
            await asyncio.wait_for(send, self._stall_timeout_s)
        except TimeoutError:
            raise SinkStalled(f"no progress writing to the client for {self._stall_timeout_s:g} s") from None


async def stream_handler(request: web.Request) -> web.StreamResponse:
    gw = request.app[GATEWAY]
    refused = gw.admit(request, opens_session=True)
    if refused is not None:
        return refused
    client = gw.take_client(request, session=True)
    if isinstance(client, web.Response):
        return client
    given = False

    def give_back() -> None:
        nonlocal given
        if not given:
            given = True
            gw.give_client(client, session=True)

    try:
        return await _serve_session(request, gw, client, give_back)
    finally:
        give_back()


async def _serve_session(
    request: web.Request, gw: Gateway, client: Client, give_back: Callable[[], None]
) -> web.WebSocketResponse:
    engine, cfg = gw.pick_engine(), gw.config
    offered = [p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",")]
    ws = web.WebSocketResponse(
        max_msg_size=MAX_MESSAGE_BYTES,  # larger: aiohttp closes with 1009 (message too big)
        heartbeat=cfg.ws_heartbeat_s,
        compress=False,
        timeout=CLOSE_HANDSHAKE_TIMEOUT_S,
        # The close reply waits for the session's end, holds given back: a client that has seen its
        # session closed may open the next at once, within its quota.
        autoclose=False,
        # A browser fails the handshake unless the server selects the token subprotocol it offered.
        protocols=[p for p in offered if p.startswith(TOKEN_SUBPROTOCOL_PREFIX)][:1],
    )
    await ws.prepare(request)
    bound_send_buffer(request, cfg.send_buffer_bytes)
    sink = WebSocketSink(ws, engine.info.sample_rate_hz, cfg.write_stall_timeout_s)
    session = Session(
        engine, sink, uuid.uuid4().hex[:12], cfg.limits, gw.metrics, "websocket", gw.voices, gw.stream_share(client)
    )
    gw.sessions.add(session)
    gw.metrics.sessions.labels("websocket").inc()
    receiver = asyncio.create_task(_receive(ws, session))
    watchdog = asyncio.create_task(_watch(ws, session, gw))
    close: tuple[int, str] | None = None
    try:
        await session.start()
        done, _ = await asyncio.wait({receiver, watchdog}, return_when=asyncio.FIRST_COMPLETED)
        if watchdog in done:
            close = watchdog.result()
        elif receiver.exception() is not None and isinstance(receiver.exception(), SinkStalled):
            close = (CLOSE_SLOW_CONSUMER, "slow_consumer")
    except SinkStalled:
        close = (CLOSE_SLOW_CONSUMER, "slow_consumer")
    finally:
        # The close must come from this task: aiohttp cuts a close short (no waiting for the client's
        # reply, so its unread pings turn into a TCP reset) when another task is inside receive().
        for task in (receiver, watchdog):
            task.cancel()
        await asyncio.gather(receiver, watchdog, return_exceptions=True)
        gw.sessions.discard(session)
        gw.metrics.sessions.labels("websocket").dec()
        await session.close()
        give_back()
        if close is not None:
            code, why = close
            log.info("session %s: closing with %d (%s)", session.session_id, code, why)
            if code == CLOSE_SLOW_CONSUMER:
                gw.metrics.errors.labels(why).inc()
            else:
                with contextlib.suppress(Exception):
                    await session.send_error(why, f"session closed: {why.replace('_', ' ')}", always=True)
        if not ws.closed:
            code, why = close or (1000, "")
            # drain=False: the close frame queues behind what the client has not read yet. Only a
            # slow consumer gets long to read up to it; otherwise the reply is due in a few seconds.
            wait_s = CLOSE_HANDSHAKE_TIMEOUT_S if code == CLOSE_SLOW_CONSUMER else CLOSE_REPLY_TIMEOUT_S
            with contextlib.suppress(Exception):
                await asyncio.wait_for(ws.close(code=code, message=why.encode(), drain=False), wait_s)
        unhook_heartbeat(request)
    return ws


def unhook_heartbeat(request: web.Request) -> None:
    """aiohttp leaves a WebSocket's heartbeat hook on the connection once the socket is closed: protocol ->
    hook -> WebSocketResponse -> request -> protocol, ~30 objects a session that only a full collection
    frees, by then in the oldest generation, where every full collection walks them."""
    protocol = request.protocol
    if getattr(protocol, "_data_received_cb", None) is not None:
        protocol._data_received_cb = None


async def _receive(ws: web.WebSocketResponse, session: Session) -> None:
    async for msg in ws:
        if msg.type in (WSMsgType.TEXT, WSMsgType.BINARY):
            await session.receive(msg.data)
        elif msg.type == WSMsgType.ERROR:
            log.info("session %s: websocket error %s", session.session_id, ws.exception())
            return


async def _watch(ws: web.WebSocketResponse, session: Session, gw: Gateway) -> tuple[int, str]:
    """Returns when the session must close: lifetime, idle time, a stalled client, or server drain."""
    reasons = {"session_expired": CLOSE_SESSION_EXPIRED, "idle_timeout": CLOSE_IDLE}
    while True:
        await asyncio.sleep(WATCHDOG_INTERVAL_S)
        if session.slow_consumer:
            return CLOSE_SLOW_CONSUMER, "slow_consumer"
        why = session.expired(time.monotonic())
        if why is not None:
            return reasons[why], why
        if gw.draining and session.open_turns == 0:
            return CLOSE_DRAINING, "draining"
