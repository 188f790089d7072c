"""WebSocket transport: ``GET /v1/stream`` speaks protocol v1; audio goes out as binary messages."""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

from aiohttp import WSMsgType, web

from engine import AudioChunk

from .audio import TurnAudioEncoder
from .protocol import MAX_MESSAGE_BYTES, dumps
from .session import Session, Turn

log = logging.getLogger("voicewire.ws")


class WebSocketSink:
    """Session output over one WebSocket. Sends are serialized so JSON and audio keep their order."""

    def __init__(self, ws: web.WebSocketResponse, engine_rate_hz: int) -> None:
        self._ws = ws
        self._lock = asyncio.Lock()
        self._rate = engine_rate_hz
        self._encoders: dict[int, TurnAudioEncoder] = {}

    async def send_json(self, msg: dict[str, Any]) -> None:
        async with self._lock:
            if not self._ws.closed:
                await self._ws.send_str(dumps(msg))

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
                await self._ws.send_bytes(p)


async def stream_handler(request: web.Request) -> web.WebSocketResponse:
    engine = request.app["engine"]
    ws = web.WebSocketResponse(
        max_msg_size=MAX_MESSAGE_BYTES,  # larger: aiohttp closes with 1009 (message too big)
        heartbeat=request.app["config"].ws_heartbeat_s,
        compress=False,
    )
    await ws.prepare(request)
    session = Session(engine, WebSocketSink(ws, engine.model.info.sample_rate_hz), uuid.uuid4().hex[:12])
    sessions: set[Session] = request.app["sessions"]
    sessions.add(session)
    try:
        await session.start()
        async for msg in ws:
            if msg.type in (WSMsgType.TEXT, WSMsgType.BINARY):
                await session.receive(msg.data)
            elif msg.type == WSMsgType.ERROR:
                log.info("session %s: websocket error %s", session.session_id, ws.exception())
                break
    finally:
        sessions.discard(session)
        await session.close()
    return ws
