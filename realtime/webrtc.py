"""WebRTC transport: ``POST /offer`` answers a browser's SDP; audio rides a paced Opus track, control a
data channel.

The client creates the peer connection: one audio transceiver (recvonly) and one data channel
labelled ``control`` that carries protocol v1 JSON both ways, exactly as on the WebSocket. The
server answers non-trickle (aiortc gathers every host candidate before ``setLocalDescription``
returns; with no STUN/TURN that takes a few ms).

Lifecycle of one peer:

1. ``POST /offer``: the body is validated (4xx JSON errors), ``.local`` mDNS candidates are dropped,
   the answer carries the paced track (``realtime.pacer``), sendonly.
2. The ``control`` channel opens: a ``Session`` starts with a ``WebRtcSink`` and sends
   ``session.created``.
3. Ends on any of: the channel closes (page closed, SCTP ABORT), the connection or ICE state goes
   ``failed``/``closed`` (DTLS close_notify, ICE consent lost), no channel within
   ``CONNECT_TIMEOUT_S``, or server shutdown. Ending closes the session first (its engine streams
   are freed at once), then the peer connection.

Below it: the offer's checks (webrtc_offer.py), ICE knobs and candidates (ice.py), and the session
sink that paces a turn's audio out (webrtc_sink.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any

from aiohttp import web
from aiortc import RTCPeerConnection, RTCRtpSender, RTCSessionDescription
from aiortc.rtcdatachannel import RTCDataChannel

from .gateway import GATEWAY, RequestError, error_response
from .ice import filter_candidates, install_ice_knobs, rtc_configuration
from .pacer import SAMPLE_RATE_HZ, PacedAudioTrack
from .protocol import MAX_ECHO_CHARS
from .quotas import Client
from .session import Session
from .turn import AudioSettings
from .webrtc_offer import CONTROL_LABEL, read_offer
from .webrtc_sink import WebRtcSink

__all__ = ["WebRtcPeer", "WebRtcSink", "filter_candidates", "offer_handler", "rtc_configuration", "setup_webrtc"]

log = logging.getLogger("voicewire.webrtc")

NEGOTIATION_TIMEOUT_S = 10.0  # setRemote + gather + setLocal: ~20 ms on loopback with no STUN/TURN
WATCHDOG_INTERVAL_S = 1.0
CONNECT_TIMEOUT_S = 15.0  # answer sent -> control channel open; a peer that never connects is freed
ENDED_STATES = ("failed", "closed")
OPUS_ONLY = [c for c in RTCRtpSender.getCapabilities("audio").codecs if c.mimeType.lower() == "audio/opus"]


# --- one peer -------------------------------------------------------------------------------------------
class WebRtcPeer:
    """One call: its RTCPeerConnection, paced track, ``control`` channel and Session."""

    def __init__(self, app: web.Application, pc: RTCPeerConnection) -> None:
        self.peer_id = uuid.uuid4().hex[:12]
        self.pc = pc
        self.track = PacedAudioTrack()
        self.session: Session | None = None
        self.client: Client | None = None  # whose call: holds one of its sessions (quotas.py)
        self._app = app
        self._inbox: asyncio.Queue[str | bytes] = asyncio.Queue()
        self._tasks: set[asyncio.Task[None]] = set()
        self._close_task: asyncio.Task[None] | None = None
        self.close_reason = ""
        pc.on("datachannel", self._on_datachannel)
        pc.on("connectionstatechange", self._on_state_change)
        pc.on("iceconnectionstatechange", self._on_state_change)

    async def answer(self, offer_sdp: str) -> RTCSessionDescription:
        try:
            await self.pc.setRemoteDescription(RTCSessionDescription(sdp=offer_sdp, type="offer"))
        except Exception as err:  # aiortc raises ValueError and friends for SDP it cannot use
            raise RequestError(400, "invalid_sdp", f"the offer was refused: {str(err)[:MAX_ECHO_CHARS]}") from None
        transceivers = self.pc.getTransceivers()
        audio = next(t for t in transceivers if t.kind == "audio")  # read_offer checked there is one
        self.pc.addTrack(self.track)
        audio.setCodecPreferences(OPUS_ONLY)
        # sendonly: a browser that offers its microphone must not leave an unread inbound track
        # (aiortc queues its frames without bound); any other media section is switched off.
        audio.direction = "sendonly"
        for t in transceivers:
            if t is not audio:
                t.direction = "inactive"
        await self.pc.setLocalDescription(await self.pc.createAnswer())
        self._spawn(self._expect_session())
        return self.pc.localDescription

    # --- events ---------------------------------------------------------------------------------
    def _on_datachannel(self, channel: RTCDataChannel) -> None:
        if channel.label != CONTROL_LABEL or self.session is not None:
            log.info("peer %s: ignoring data channel %r", self.peer_id, channel.label)
            return
        gw = self._app[GATEWAY]
        sink = WebRtcSink(channel, self.track, gw.engine.info.sample_rate_hz)
        share = gw.stream_share(self.client) if self.client is not None else None
        self.session = Session(
            gw.pick_engine(), sink, self.peer_id, gw.config.limits, gw.metrics, "webrtc", gw.voices, share
        )
        self.session.audio = AudioSettings(format="opus", sample_rate=SAMPLE_RATE_HZ)
        channel.on("message", self._inbox.put_nowait)
        channel.on("close", lambda: self.close("control channel closed"))
        self._spawn(self._run_session(self.session))

    def _on_state_change(self) -> None:
        if self.pc.connectionState in ENDED_STATES or self.pc.iceConnectionState in ENDED_STATES:
            self.close(f"connection {self.pc.connectionState}, ICE {self.pc.iceConnectionState}")

    async def _run_session(self, session: Session) -> None:
        gw = self._app[GATEWAY]
        gw.sessions.add(session)
        gw.metrics.sessions.labels("webrtc").inc()
        try:
            await session.start()
            self._spawn(self._watch(session))
            while True:
                await session.receive(await self._inbox.get())
        except Exception:
            log.exception("peer %s: session failed", self.peer_id)
        finally:
            self.close("session ended")

    async def _watch(self, session: Session) -> None:
        """Lifetime and idle time, as on the WebSocket (which also ends a session's idle turns)."""
        while True:
            await asyncio.sleep(WATCHDOG_INTERVAL_S)
            why = session.expired(time.monotonic())
            if why is not None:
                await session.send_error(why, f"session closed: {why.replace('_', ' ')}", always=True)
                self.close(why)
                return

    async def _expect_session(self) -> None:
        await asyncio.sleep(CONNECT_TIMEOUT_S)
        if self.session is None:
            self.close(f"no {CONTROL_LABEL!r} channel within {CONNECT_TIMEOUT_S:.0f} s")

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- teardown -------------------------------------------------------------------------------
    def close(self, reason: str) -> asyncio.Task[None]:
        """End the call (idempotent); await the result to wait until it is closed."""
        if self._close_task is None:
            self.close_reason = reason
            self._close_task = asyncio.ensure_future(self._close())
        return self._close_task

    async def _close(self) -> None:
        log.info("peer %s: closing (%s)", self.peer_id, self.close_reason)
        current = asyncio.current_task()
        for task in list(self._tasks):
            if task is not current:
                task.cancel()
        try:
            if self.session is not None and self.session in self._app[GATEWAY].sessions:
                self._app[GATEWAY].sessions.discard(self.session)
                self._app[GATEWAY].metrics.sessions.labels("webrtc").dec()
                await self.session.close()  # frees engine streams before the slower transport teardown
            self.track.stop()
            await self.pc.close()
        finally:
            if self.client is not None:
                self._app[GATEWAY].give_client(self.client, session=True)
                self.client = None
            # Last, so that shutdown still finds (and awaits) a peer that is half closed.
            self._app[GATEWAY].peers.discard(self)


# --- HTTP -----------------------------------------------------------------------------------------------
async def offer_handler(request: web.Request) -> web.Response:
    app = request.app
    gw = app[GATEWAY]
    config = gw.config
    refused = gw.admit(request, opens_session=True, json_body=True)
    if refused is not None:
        return refused
    try:
        sdp = await read_offer(request)
    except RequestError as err:
        return err.response()
    peers = gw.peers
    if len(peers) >= config.max_webrtc_peers:
        return error_response(503, "too_many_peers", f"this server takes at most {config.max_webrtc_peers} calls")
    client = gw.take_client(request, session=True)
    if isinstance(client, web.Response):
        return client
    peer = WebRtcPeer(app, RTCPeerConnection(rtc_configuration(config)))
    peer.client = client  # given back when the call ends, however it ends
    peers.add(peer)
    try:
        answer = await asyncio.wait_for(peer.answer(sdp), NEGOTIATION_TIMEOUT_S)
    except RequestError as err:
        await peer.close(f"bad offer: {err.code}")
        return err.response()
    except TimeoutError:
        await peer.close("negotiation timed out")
        return error_response(504, "negotiation_timeout", f"no answer within {NEGOTIATION_TIMEOUT_S:.0f} s")
    return web.json_response({"sdp": answer.sdp, "type": answer.type})


def setup_webrtc(app: web.Application, base_path: str = "") -> None:
    """Add ``POST {base_path}/offer`` and close every peer on shutdown."""

    async def on_startup(app: web.Application) -> None:
        install_ice_knobs(app[GATEWAY].config)

    async def on_shutdown(app: web.Application) -> None:
        await asyncio.gather(*(peer.close("server shutdown") for peer in list(app[GATEWAY].peers)))

    app.on_startup.append(on_startup)
    app.on_shutdown.append(on_shutdown)
    app.router.add_post(f"{base_path}/offer", offer_handler)
