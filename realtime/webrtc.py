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
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import re
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import aioice.ice
from aiohttp import web
from aiortc import (
    RTCConfiguration,
    RTCIceServer,
    RTCPeerConnection,
    RTCRtpSender,
    RTCSessionDescription,
)
from aiortc.rtcdatachannel import RTCDataChannel
from aiortc.sdp import SessionDescription

from voicewire.engine import AudioChunk

from .audio import FrameCutter, Resampler
from .config import GatewayConfig
from .gateway import GATEWAY, RequestError, error_response
from .http_api import read_json_body
from .pacer import FRAME_SAMPLES, SAMPLE_RATE_HZ, PacedAudioTrack, Playback
from .protocol import MAX_ECHO_CHARS, dumps
from .quotas import Client
from .session import Session
from .truncation import SpokenWord
from .turn import AudioSettings, Turn

log = logging.getLogger("voicewire.webrtc")

CONTROL_LABEL = "control"
NEGOTIATION_TIMEOUT_S = 10.0  # setRemote + gather + setLocal: ~20 ms on loopback with no STUN/TURN
WATCHDOG_INTERVAL_S = 1.0
CONNECT_TIMEOUT_S = 15.0  # answer sent -> control channel open; a peer that never connects is freed
# end_turn waits for the turn's queued audio to be paced out; a track nobody pulls (RTP never
# started) would hold the session forever, so the wait is bounded by the queue plus this slack.
DRAIN_SLACK_S = 2.0
ENDED_STATES = ("failed", "closed")
OPUS_ONLY = [c for c in RTCRtpSender.getCapabilities("audio").codecs if c.mimeType.lower() == "audio/opus"]

_STOCK_GET_HOST_ADDRESSES = aioice.ice.get_host_addresses


# --- ICE knobs --------------------------------------------------------------------------------------
def install_ice_knobs(config: GatewayConfig) -> None:
    """Set aioice's host addresses and consent timing (process-wide: aioice has no per-connection
    option for either).

    Stock aioice skips 127.0.0.1, so a gateway bound to loopback inside a container with no LAN
    offers no candidate at all and ICE never starts (chromium-webrtc.md T1). aioice calls the
    function with keyword arguments, so the replacement keeps its parameter names. The consent
    constants are read by aioice on every check, so setting them here takes effect for new calls.
    """
    fixed = config.ice_host_addresses
    add_loopback = fixed is None and _is_loopback(config.host)

    def get_host_addresses(use_ipv4: bool, use_ipv6: bool) -> list[str]:
        if fixed is not None:
            return list(fixed)
        found = _STOCK_GET_HOST_ADDRESSES(use_ipv4=use_ipv4, use_ipv6=use_ipv6)
        return ["127.0.0.1", *found] if add_loopback and use_ipv4 else found

    aioice.ice.get_host_addresses = get_host_addresses
    aioice.ice.CONSENT_INTERVAL = config.ice_consent_interval_s  # type: ignore[assignment]
    aioice.ice.CONSENT_FAILURES = config.ice_consent_failures


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _gathered_families() -> set[int]:
    """IP versions of the server's own host candidates (what ``install_ice_knobs`` set)."""
    hosts = aioice.ice.get_host_addresses(use_ipv4=True, use_ipv6=True)
    return {ipaddress.ip_address(h).version for h in hosts}


def filter_candidates(sdp: str, families: set[int]) -> str:
    """Keep only the offer's candidates the server should send connectivity checks to: IP
    literals of a family it gathers itself, unicast.

    ``<uuid>.local`` mDNS names (and any other host name) go: aioice would resolve each with a
    multicast query and wait its 1 s timeout before answering (chromium-webrtc.md T2). The call
    still connects without them: the browser reaches the server's own candidate and ICE learns
    the peer-reflexive address. Candidates of another family or a multicast/unspecified address
    could only make the server send checks where no peer of this call listens.
    """
    lines = sdp.splitlines(keepends=True)
    return "".join(line for line in lines if not _unusable_candidate(line, families))


def _unusable_candidate(line: str, families: set[int]) -> bool:
    if not line.startswith("a=candidate:"):
        return False
    fields = line.split()
    if len(fields) < 8:
        return True
    try:
        address = ipaddress.ip_address(fields[4])
    except ValueError:
        return True  # a host name: mDNS or anything else that needs a lookup
    return address.version not in families or address.is_multicast or address.is_unspecified


# RFC 8839's candidate-attribute as aiortc's parser reads it (it asserts there are 8 fields and
# int()s the component, priority, port, rport and generation): foundation component transport
# priority address port "typ" type, then name-value pairs.
_CANDIDATE_INTEGERS = ((1, "component", 1, 256), (3, "priority", 0, 2**32 - 1), (5, "port", 0, 65_535))
_INTEGER_EXTENSIONS = ("rport", "generation")
_DIGITS = re.compile(r"[0-9]{1,10}")  # ASCII digits only: int() also takes "\u0661" and "1_0"


def _candidate_problem(line: str) -> str | None:
    """What makes an ``a=candidate:`` line unreadable, or None for one aiortc can parse."""
    fields = line.removeprefix("a=candidate:").split()
    if len(fields) < 8 or fields[6] != "typ":
        return "needs foundation, component, transport, priority, address, port, typ and a type"
    for at, name, low, high in _CANDIDATE_INTEGERS:
        if not (_DIGITS.fullmatch(fields[at]) and low <= int(fields[at]) <= high):
            return f"has a {name} that is not an integer within {low}..{high}"
    for name, value in zip(fields[8::2], fields[9::2], strict=False):
        if name in _INTEGER_EXTENSIONS and not _DIGITS.fullmatch(value):
            return f"has a {name} that is not an integer"
    return None


def rtc_configuration(config: GatewayConfig) -> RTCConfiguration:
    # iceServers=[] and not None: aiortc's default for None is a public Google STUN server.
    servers = [RTCIceServer(list(s.urls), s.username, s.credential) for s in config.ice_servers]
    return RTCConfiguration(iceServers=servers)


# --- offer validation ---------------------------------------------------------------------------------
async def read_offer(request: web.Request) -> str:
    """The offer's SDP, with only the ICE candidates the server may check; RequestError
    with a 4xx status."""
    config = request.app[GATEWAY].config
    body = await read_json_body(request, config.http_body_timeout_s)  # RequestError: 4xx as it is
    if not isinstance(body, dict):
        raise RequestError(400, "invalid_request", 'the body must be {"sdp": ..., "type": "offer"}')
    if body.get("type") != "offer":
        raise RequestError(400, "invalid_type", 'type must be "offer"')
    sdp = body.get("sdp")
    if not isinstance(sdp, str) or not sdp.startswith("v=0"):
        raise RequestError(400, "invalid_sdp", "sdp must be a session description string starting with v=0")
    for number, line in enumerate(sdp.splitlines(), 1):
        problem = _candidate_problem(line) if line.startswith("a=candidate:") else None
        if problem is not None:  # one code for any SDP the server cannot read; the line says where
            raise RequestError(400, "invalid_sdp", f"the ICE candidate on line {number} {problem}")
    try:
        media = SessionDescription.parse(sdp).media
    except Exception:  # aiortc's parser raises AssertionError, ValueError, IndexError... on bad SDP
        raise RequestError(400, "invalid_sdp", "the SDP could not be parsed: a line is malformed") from None
    if not any(
        m.kind == "audio" and any(c.mimeType.lower() == "audio/opus" for c in m.rtp.codecs) for m in media
    ):
        raise RequestError(
            400, "no_audio", "the offer needs an audio section with Opus (a recvonly transceiver)"
        )
    if not any(m.kind == "application" for m in media):
        raise RequestError(400, "no_data_channel", f"the offer needs a data channel labelled {CONTROL_LABEL!r}")
    # aiortc checks ICE credentials but not fingerprints: without one, DTLS fails later, silently.
    if not all(
        m.ice and m.ice.usernameFragment and m.ice.password and m.dtls and m.dtls.fingerprints for m in media
    ):
        raise RequestError(
            400, "invalid_sdp", "every media section needs ice-ufrag, ice-pwd and a DTLS fingerprint"
        )
    candidates = sum(line.startswith("a=candidate:") for line in sdp.splitlines())
    if candidates > config.max_offer_candidates:
        raise RequestError(
            400,
            "too_many_candidates",
            f"an offer may carry at most {config.max_offer_candidates} ICE candidates, not {candidates}",
        )
    return filter_candidates(sdp, _gathered_families())


# --- the session sink ---------------------------------------------------------------------------------
@dataclass
class _TurnOut:
    resampler: Resampler  # engine rate -> 48 kHz, once, stateful over the turn
    cutter: FrameCutter  # exact 960-sample frames
    playback: Playback
    words: deque[SpokenWord] = field(default_factory=deque)  # timed words not sent yet, in order


class WebRtcSink:
    """Session output over WebRTC: JSON on the ``control`` channel, audio on the paced track.

    The track always carries 48 kHz Opus, whatever ``session.update`` asked for (that only shapes
    WebSocket audio). ``end_turn`` returns once the turn's last frame has left the pacer, so
    ``turn.done`` follows the audio, and ``played_ms`` is what was paced out, not what was queued.
    """

    played_source = "paced"

    def __init__(self, channel: RTCDataChannel, track: PacedAudioTrack, engine_rate_hz: int) -> None:
        self._channel = channel
        self._track = track
        self._rate = engine_rate_hz
        self._turns: dict[int, _TurnOut] = {}

    async def send_json(self, msg: dict[str, Any]) -> None:
        if self._channel.readyState == "open":
            self._channel.send(dumps(msg))

    async def start_turn(self, turn: Turn) -> None:
        playback = Playback(is_cancelled=lambda: turn.cancelled)
        out = _TurnOut(Resampler(self._rate, SAMPLE_RATE_HZ), FrameCutter(FRAME_SAMPLES), playback)
        playback.on_frame = lambda: self._pace_words(turn, out)
        self._turns[id(turn)] = out

    async def send_words(self, turn: Turn, words: list[SpokenWord]) -> None:
        # Held until the pacer sends the frame holding each word's first sample (_pace_words).
        out = self._turns.get(id(turn))
        if out is not None:
            out.words.extend(words)

    def _pace_words(self, turn: Turn, out: _TurnOut) -> None:
        """The pacer is sending a frame of this turn: the words starting up to its end go now."""
        played = out.playback.played_samples * self._rate // SAMPLE_RATE_HZ  # at the engine's rate
        due = []
        while out.words and out.words[0].start_sample < played:
            due.append(out.words.popleft().describe(self._rate))
        if due and self._channel.readyState == "open":
            self._channel.send(dumps({"type": "turn.words", "turn_id": turn.turn_id, "words": due}))

    async def send_audio(self, turn: Turn, chunk: AudioChunk) -> None:
        out = self._turns[id(turn)]
        if chunk.pcm.size:
            for frame in out.cutter.push(out.resampler.push(chunk.pcm)):
                self._track.enqueue(out.playback, frame)

    async def end_turn(self, turn: Turn, cancelled: bool) -> float:
        out = self._turns.pop(id(turn), None)
        if out is None:
            return 0.0
        pb = out.playback
        if cancelled:
            self._track.drop(pb)
            return pb.played_ms
        for frame in out.cutter.push(out.resampler.flush()):
            self._track.enqueue(pb, frame)
        tail_samples = out.cutter.buffered_samples
        for frame in out.cutter.flush():
            self._track.enqueue(pb, frame, real_samples=tail_samples)
        self._track.finish(pb)
        try:
            await asyncio.wait_for(pb.drained.wait(), pb.pending_s + DRAIN_SLACK_S)
        except TimeoutError:
            log.warning("turn %r: audio was not pulled by the track; dropping it", turn.turn_id)
            self._track.drop(pb)
        if out.words and not pb.dropped:  # words timed at the very end of the audio (none is left unsaid)
            out.playback.played_samples += FRAME_SAMPLES
            self._pace_words(turn, out)
            out.playback.played_samples -= FRAME_SAMPLES
        return pb.played_ms


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
