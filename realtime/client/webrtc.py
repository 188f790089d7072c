"""Python WebRTC client (an aiortc peer): protocol v1 on the ``control`` data channel, audio on the
track, with what a latency probe or a test needs to see on the wire.

It does what the demo page does (recvonly audio transceiver, a ``control`` data channel,
non-trickle offer to ``POST /offer``) and offers the same turns as ``VoicewireClient``:

    client = await WebRtcClient.connect("http://127.0.0.1:8080")
    async for frame in client.speak(deltas):     # ReceivedAudio: 20 ms of 48 kHz PCM16 mono
        ...

Besides, it records every RTP packet as it arrives (``packets``: arrival time, place on the RTP
clock, level and first audible window of its Opus payload, decoded on the spot), before aiortc's
jitter buffer, which holds 4 packets (80 ms) and would hide the wire timing; and when aiortc's
own receive path hands each frame out (``frame_times``), which gives the jitter buffer's delay.

A turn's audio is the stretch of the RTP clock between its ``turn.started`` and ``turn.done``
(audio packets carry no turn id); the server sends silence between turns, which is left out.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import aiohttp
import av
import numpy as np
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from voicewire.engine import ONSET_THRESHOLD_DBFS, dbfs, first_audible_sample

from .messages import ReceivedAudio, TurnDone, TurnId, VoicewireError
from .protocol import ProtocolClient, Turn

SAMPLE_RATE_HZ = 48_000  # what aiortc's Opus decoder puts out
FRAME_SAMPLES = 960  # 20 ms
# A turn's last frames leave aiortc's jitter buffer ~80 ms (4 packets) after they arrived; its
# turn.done (on the data channel) comes at about their arrival. The turn's audio() waits this long
# at most for them.
JITTER_BUFFER_WAIT_S = 0.3
RTP_WRAP = 1 << 32
SILENCE_DBFS = -120.0  # the level reported for digital silence (what the server sends between turns)
# Decoded digital silence sits below -90 dBFS; a packet above this carries some of a turn's sound
# (the engine keeps 10 ms of quiet lead-in before the first audible window).
SOUND_DBFS = -70.0


@dataclass(frozen=True)
class PacketLog:
    """One RTP packet as it arrived, before the jitter buffer."""

    t_arrival_s: float  # time.perf_counter()
    pts: int  # place on the RTP clock (48 kHz samples), from the first packet, unwrapped
    samples: int  # decoded samples (per channel)
    level_dbfs: float  # RMS of the packet's loudest 10 ms window
    onset_sample: int | None  # start of its first 10 ms window above ONSET_THRESHOLD_DBFS, if any


@dataclass
class _TurnWindow:
    turn: Turn
    start_pts: int  # first RTP sample that may be the turn's
    end_pts: int | None = None  # set at turn.done: last sample that arrived by then
    done: TurnDone | None = None
    deadline_s: float = 0.0


class WebRtcClient(ProtocolClient):
    """Protocol v1 over WebRTC (``POST /offer``, ``control`` data channel, Opus track)."""

    # The server's pacer knows what it sent on the wall clock (turn.done played_source "paced").
    reports_playback = False

    def __init__(self) -> None:
        super().__init__()
        self.audio_format = "pcm16"  # decoded here: turns yield PCM, whatever Opus carried
        self.sample_rate_hz = SAMPLE_RATE_HZ
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.packets: list[PacketLog] = []
        self.frame_times: dict[int, float] = {}  # pts -> perf_counter when aiortc's track gave it out
        self._decoder = av.CodecContext.create("libopus", "r")
        self._decoder.sample_rate = SAMPLE_RATE_HZ  # type: ignore[attr-defined]
        self._decoder.layout = "mono"  # type: ignore[attr-defined]
        self._decoder.format = "s16"  # type: ignore[attr-defined]
        self._first_ts: int | None = None
        self._last_ts = 0
        self._wraps = 0
        self._windows: deque[_TurnWindow] = deque()
        self._tasks: list[asyncio.Task[None]] = []
        self._receiver: Any = None
        self.channel: Any = None
        self.answer_sdp = ""  # the server's SDP answer
        self.turns: list[Turn] = []  # every turn of this connection, in order

    @classmethod
    async def connect(
        cls, base_url: str, *, api_key: str | None = None, timeout_s: float = 10.0
    ) -> WebRtcClient:
        """Offer, answer, wait for ``session.created``. ``api_key``: sent as ``Authorization: Bearer``."""
        client = cls()
        try:
            await asyncio.wait_for(client._connect(base_url.rstrip("/"), api_key), timeout_s)
        except BaseException:
            await client.close()
            raise
        return client

    async def _connect(self, base_url: str, api_key: str | None) -> None:
        if "://" not in base_url:
            base_url = "http://" + base_url
        transceiver = self.pc.addTransceiver("audio", direction="recvonly")
        self._receiver = transceiver.receiver
        self.channel = self.pc.createDataChannel("control")
        self.channel.on("message", self._on_channel_message)
        self.channel.on("close", lambda: self._connection_lost("control channel closed"))
        self._tap(transceiver.receiver)
        self.pc.on("track", lambda track: self._tasks.append(asyncio.ensure_future(self._drain(track))))
        created = self._expect("session.created")
        await self.pc.setLocalDescription(await self.pc.createOffer())
        offer = {"sdp": self.pc.localDescription.sdp, "type": "offer"}
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{base_url}/offer", json=offer, headers=headers) as resp,
        ):
            body = await resp.json()
            if resp.status != 200:
                err = body.get("error", {}) if isinstance(body, dict) else {}
                raise VoicewireError(str(err.get("code", resp.status)), str(err.get("message", body)))
        self.answer_sdp = body["sdp"]
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=body["sdp"], type=body["type"]))
        await created

    # --- transport ----------------------------------------------------------------------------------
    async def _send(self, msg: dict[str, Any]) -> None:
        if self._closed or self.channel is None or self.channel.readyState != "open":
            raise VoicewireError("connection_closed", "the control channel is not open")
        self.channel.send(json.dumps(msg, separators=(",", ":"), ensure_ascii=False))

    def _on_channel_message(self, raw: str | bytes) -> None:
        msg = json.loads(raw)
        kind = msg.get("type")
        turn = self._turns.get(msg["turn_id"]) if "turn_id" in msg else None
        if kind == "turn.started" and turn is not None:
            self._windows.append(_TurnWindow(turn, self._arrived_pts()))
        if kind == "turn.done" and turn is not None:
            turn.t_done_s = time.perf_counter()
            window = next((w for w in self._windows if w.turn is turn), None)
            if window is not None:
                # Finished once its audio is out of the jitter buffer (see _route).
                window.end_pts = self._arrived_pts()
                window.done = TurnDone.from_message(msg)
                window.deadline_s = time.perf_counter() + JITTER_BUFFER_WAIT_S
                self._tasks.append(asyncio.ensure_future(self._finish_late(window)))
                turn.started = True
                if self._playing is turn:
                    self._playing = None
                return
        self._on_json(msg)

    def _arrived_pts(self) -> int:
        last = self.packets[-1] if self.packets else None
        return last.pts + last.samples if last is not None else 0

    # --- RTP in ---------------------------------------------------------------------------------------
    def _tap(self, receiver: Any) -> None:
        handle = receiver._handle_rtp_packet

        async def tapped(packet: Any, arrival_time_ms: int) -> None:
            t = time.perf_counter()
            self._log_packet(t, packet.timestamp, packet.payload)
            await handle(packet, arrival_time_ms)

        receiver._handle_rtp_packet = tapped

    def _log_packet(self, t_arrival_s: float, timestamp: int, payload: bytes) -> None:
        if self._first_ts is None:
            self._first_ts = self._last_ts = timestamp
        elif timestamp < self._last_ts and self._last_ts - timestamp > RTP_WRAP // 2:
            self._wraps += 1
        self._last_ts = timestamp
        pts = timestamp + self._wraps * RTP_WRAP - self._first_ts
        frames = self._decoder.decode(av.Packet(payload))  # type: ignore[attr-defined]
        pcm = (
            np.concatenate([f.to_ndarray().reshape(-1) for f in frames]).astype(np.float32) / 32768.0
            if frames
            else np.zeros(0, np.float32)
        )
        win = SAMPLE_RATE_HZ // 100
        n = pcm.size // win
        level = max([SILENCE_DBFS, *(dbfs(pcm[i * win : (i + 1) * win]) for i in range(n))])
        onset = first_audible_sample(pcm, SAMPLE_RATE_HZ, ONSET_THRESHOLD_DBFS)
        self.packets.append(PacketLog(t_arrival_s, pts, pcm.size, level, onset))

    async def _drain(self, track: MediaStreamTrack) -> None:
        """Read aiortc's receive path: it queues frames without bound if nobody does."""
        with contextlib.suppress(MediaStreamError):
            while True:
                frame = await track.recv()
                t = time.perf_counter()
                pts = frame.pts or 0
                self.frame_times[pts] = t
                stereo = frame.to_ndarray().reshape(-1, len(frame.layout.channels))  # type: ignore[union-attr]
                self._route(pts, stereo[:, 0].astype("<i2").tobytes(), t)

    def _route(self, pts: int, pcm16: bytes, t: float) -> None:
        """Give a decoded frame to the turn whose stretch of the RTP clock holds it."""
        while self._windows:
            w = self._windows[0]
            if w.end_pts is not None and pts >= w.end_pts:
                self._windows.popleft()
                self._finish_window(w)
                continue
            if pts >= w.start_pts:
                w.turn._push_audio(ReceivedAudio(pcm16, "pcm16", SAMPLE_RATE_HZ, t))
            return

    async def _finish_late(self, window: _TurnWindow) -> None:
        await asyncio.sleep(max(0.0, window.deadline_s - time.perf_counter()))
        if window in self._windows:
            self._windows.remove(window)
        self._finish_window(window)

    def _finish_window(self, window: _TurnWindow) -> None:
        if window.done is not None:
            window.turn._finish(window.done)

    # --- read-outs ------------------------------------------------------------------------------------
    def packets_between(self, t_from_s: float, t_to_s: float) -> list[PacketLog]:
        return [p for p in self.packets if t_from_s <= p.t_arrival_s <= t_to_s]

    def turn_packets(self, turn: Turn, tail_s: float = 0.1) -> list[PacketLog]:
        """Packets that arrived from the turn's first delta to its ``turn.done`` and ``tail_s``
        more (the last frames' transport), but not past the next turn's first delta."""
        if turn.t_first_text_s is None:
            return []
        end = (turn.t_done_s or time.perf_counter()) + tail_s
        later = [t.t_first_text_s for t in self.turns if t.t_first_text_s and t.t_first_text_s > turn.t_first_text_s]
        return self.packets_between(turn.t_first_text_s, min([end, *later]))

    def wire_ttfa_s(self, turn: Turn, threshold_dbfs: float = ONSET_THRESHOLD_DBFS) -> float | None:
        """First delta sent -> the first packet with a 10 ms window above ``threshold_dbfs``
        (``SOUND_DBFS``: the first packet with any of the turn's sound)."""
        for p in self.turn_packets(turn):
            if p.level_dbfs > threshold_dbfs and turn.t_first_text_s is not None:
                return p.t_arrival_s - turn.t_first_text_s
        return None

    def audible_inter_arrivals_s(self, turn: Turn) -> np.ndarray:
        """Gaps between packet arrivals from the turn's first to its last audible packet."""
        pkts = self.turn_packets(turn)
        audible = [i for i, p in enumerate(pkts) if p.level_dbfs > ONSET_THRESHOLD_DBFS]
        if len(audible) < 2:
            return np.zeros(0)
        return np.diff([p.t_arrival_s for p in pkts[audible[0] : audible[-1] + 1]])

    def jitter_buffer_delays_s(self, packets: list[PacketLog]) -> list[float]:
        """For each packet, arrival -> its frame out of aiortc's jitter buffer + decoder."""
        return [self.frame_times[p.pts] - p.t_arrival_s for p in packets if p.pts in self.frame_times]

    async def receiver_stats(self) -> dict[str, float]:
        """aiortc's inbound-rtp stats: packets received/lost and RFC 3550 interarrival jitter."""
        if self._receiver is None:
            return {}
        report = await self._receiver.getStats()
        for s in report.values():
            if getattr(s, "type", "") == "inbound-rtp":
                return {
                    "packets_received": float(s.packetsReceived),
                    "packets_lost": float(s.packetsLost),
                    "jitter_ms": float(s.jitter) * 1000 / SAMPLE_RATE_HZ,  # RTP clock units
                }
        return {}

    def _new_turn(self, turn_id: TurnId | None, options: dict[str, Any] | None = None) -> Turn:
        turn = super()._new_turn(turn_id, options)
        self.turns.append(turn)
        return turn

    async def close(self) -> None:
        self._closed = True
        for t in self._tasks:
            t.cancel()
        await self.pc.close()
        self._connection_lost("closed by the client")
