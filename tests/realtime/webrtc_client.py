"""A real aiortc client peer for tests and the WebRTC benchmark.

It does what a browser does (recvonly audio transceiver, a ``control`` data channel, non-trickle
offer to ``POST /offer``), and records what arrived:

- every RTP packet as the receiver gets it (arrival time, RTP timestamp, level of its Opus payload
  decoded on the spot), through a tap on the receiver's packet handler, before aiortc's jitter
  buffer (which holds 4 packets, 80 ms, and would hide the wire timing);
- every frame aiortc's own receive path decodes from the track (pts = RTP timestamp);
- every JSON message on ``control``.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
import av
import numpy as np
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

SAMPLE_RATE_HZ = 48_000
FRAME_SAMPLES = 960  # 20 ms
AUDIBLE_DBFS = -45.0  # the engine's onset threshold: a 10 ms window above it is audible
LEVEL_WINDOW_SAMPLES = 480  # 10 ms
# Decoded digital silence sits below -90 dBFS; a packet above this carries the turn's first sound
# (the engine keeps 10 ms of quiet lead-in before the first audible window).
FIRST_SOUND_DBFS = -70.0


@dataclass
class Packet:
    t_arrival_s: float  # time.perf_counter()
    rtp_timestamp: int
    samples: int  # decoded samples of this packet (per channel)
    level_dbfs: float


@dataclass
class TurnLog:
    turn_id: Any
    text: str
    t_first_sent_s: float = 0.0
    t_last_sent_s: float = 0.0
    done: dict[str, Any] | None = None
    t_done_s: float | None = None


def level_dbfs(pcm: np.ndarray) -> float:
    """Loudest 10 ms window, as the engine's onset detector measures it (LevelConfig)."""
    x = pcm.astype(np.float64) / 32768.0
    n = x.size // LEVEL_WINDOW_SAMPLES * LEVEL_WINDOW_SAMPLES
    if n == 0:
        return -120.0
    rms = float(np.sqrt(np.mean(x[:n].reshape(-1, LEVEL_WINDOW_SAMPLES) ** 2, axis=1)).max())
    return 20 * np.log10(rms) if rms > 0 else -120.0


class ClientPeer:
    def __init__(self) -> None:
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.packets: list[Packet] = []
        self.frames: list[tuple[int, np.ndarray]] = []  # (pts, mono int16) from aiortc's decoder
        self.messages: list[tuple[float, dict[str, Any]]] = []
        self.turns: list[TurnLog] = []  # spoken, in order
        self._decoder = av.CodecContext.create("libopus", "r")
        self._decoder.sample_rate = SAMPLE_RATE_HZ  # type: ignore[attr-defined]
        self._decoder.layout = "mono"  # type: ignore[attr-defined]
        self._decoder.format = "s16"  # type: ignore[attr-defined]
        self._arrived = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.answer_sdp = ""

    # --- connect ------------------------------------------------------------------------------
    async def connect(self, base_url: str, timeout_s: float = 10.0) -> dict[str, Any]:
        """Offer, answer, wait for ``session.created``; returns it."""
        transceiver = self.pc.addTransceiver("audio", direction="recvonly")
        self.channel = self.pc.createDataChannel("control")
        self.channel.on("message", self._on_message)
        self._tap(transceiver.receiver)
        self.pc.on("track", lambda track: self._tasks.append(asyncio.ensure_future(self._drain(track))))
        await self.pc.setLocalDescription(await self.pc.createOffer())
        offer = {"sdp": self.pc.localDescription.sdp, "type": "offer"}
        async with aiohttp.ClientSession() as http, http.post(f"{base_url}/offer", json=offer) as resp:
            body = await resp.json()
            if resp.status != 200:
                raise RuntimeError(f"/offer answered {resp.status}: {body}")
        self.answer_sdp = body["sdp"]
        await self.pc.setRemoteDescription(RTCSessionDescription(**body))
        return await self.wait_message(lambda m: m["type"] == "session.created", timeout_s)

    def _tap(self, receiver: Any) -> None:
        handle = receiver._handle_rtp_packet

        async def tapped(packet: Any, arrival_time_ms: int) -> None:
            t = time.perf_counter()
            pcm = np.concatenate(
                [f.to_ndarray().reshape(-1) for f in self._decoder.decode(av.Packet(packet.payload))]  # type: ignore[attr-defined]
            )
            self.packets.append(Packet(t, packet.timestamp, pcm.size, level_dbfs(pcm)))
            await handle(packet, arrival_time_ms)

        receiver._handle_rtp_packet = tapped

    async def _drain(self, track: MediaStreamTrack) -> None:
        try:
            while True:
                frame = await track.recv()
                stereo = frame.to_ndarray().reshape(-1, len(frame.layout.channels))  # type: ignore[union-attr]
                self.frames.append((frame.pts or 0, stereo[:, 0].copy()))
        except MediaStreamError:
            pass

    def _on_message(self, raw: str | bytes) -> None:
        self.messages.append((time.perf_counter(), json.loads(raw)))
        self._arrived.set()

    async def wait_message(self, match: Any, timeout_s: float = 30.0) -> dict[str, Any]:
        async def find() -> dict[str, Any]:
            seen = 0
            while True:
                for _, m in self.messages[seen:]:
                    if match(m):
                        return m
                seen = len(self.messages)
                self._arrived.clear()
                await self._arrived.wait()

        return await asyncio.wait_for(find(), timeout_s)

    # --- talk -------------------------------------------------------------------------------------
    def send(self, msg: dict[str, Any]) -> None:
        self.channel.send(json.dumps(msg))

    async def speak(self, turn: TurnLog, words_per_s: float) -> None:
        """A simulated LLM: one word per text.delta at ``words_per_s``, then text.end."""
        self.turns.append(turn)
        words = turn.text.split(" ")
        for i, w in enumerate(words):
            self.send(
                {"type": "text.delta", "turn_id": turn.turn_id, "text": w if i == len(words) - 1 else w + " "}
            )
            now = time.perf_counter()
            turn.t_first_sent_s = turn.t_first_sent_s or now
            turn.t_last_sent_s = now
            if i < len(words) - 1:
                await asyncio.sleep(1.0 / words_per_s)
        self.send({"type": "text.end", "turn_id": turn.turn_id})

    async def wait_done(self, turn: TurnLog, timeout_s: float = 30.0) -> dict[str, Any]:
        done = await self.wait_message(
            lambda m: m["type"] == "turn.done" and m["turn_id"] == turn.turn_id, timeout_s
        )
        turn.done = done
        turn.t_done_s = next(t for t, m in self.messages if m is done)
        return done

    # --- read-outs ------------------------------------------------------------------------------------
    def turn_packets(self, turn: TurnLog, tail_s: float = 0.1) -> list[Packet]:
        """Packets that arrived from the turn's first delta to its turn.done (+ a little, up to
        the next turn's first delta)."""
        end = (turn.t_done_s or time.perf_counter()) + tail_s
        later = [t.t_first_sent_s for t in self.turns if t.t_first_sent_s > turn.t_first_sent_s]
        end = min([end, *later])
        return [p for p in self.packets if turn.t_first_sent_s <= p.t_arrival_s <= end]

    def wire_ttfa_s(self, turn: TurnLog, threshold_dbfs: float = AUDIBLE_DBFS) -> float | None:
        """First delta sent -> first packet received with a 10 ms window above the threshold."""
        for p in self.turn_packets(turn):
            if p.level_dbfs > threshold_dbfs:
                return p.t_arrival_s - turn.t_first_sent_s
        return None

    def turn_audio(self, turn: TurnLog) -> np.ndarray:
        """The turn's audio as aiortc's receive path decoded it (mono int16, 48 kHz)."""
        if not self.frames or not self.packets:
            return np.zeros(0, np.int16)
        # aiortc's decoder counts pts from the first packet's RTP timestamp.
        origin = self.packets[0].rtp_timestamp - self.frames[0][0]
        stamps = {(p.rtp_timestamp - origin) % 2**32 for p in self.turn_packets(turn)}
        pcm = [f for pts, f in self.frames if pts in stamps]
        return np.concatenate(pcm) if pcm else np.zeros(0, np.int16)

    def audible_inter_arrivals_s(self, turn: TurnLog) -> np.ndarray:
        """Gaps between packet arrivals from the turn's first to its last audible packet."""
        pkts = self.turn_packets(turn)
        audible = [i for i, p in enumerate(pkts) if p.level_dbfs > AUDIBLE_DBFS]
        if len(audible) < 2:
            return np.zeros(0)
        times = np.array([p.t_arrival_s for p in pkts[audible[0] : audible[-1] + 1]])
        return np.diff(times)

    async def close(self) -> None:
        await self.pc.close()
        for t in self._tasks:
            t.cancel()


async def _speak_and_hang(base_url: str, text: str) -> None:
    """Connect, start a turn, say "playing" once audio arrives, then wait to be killed."""
    peer = ClientPeer()
    await peer.connect(base_url)
    turn = TurnLog("doomed", text)
    await peer.speak(turn, words_per_s=50)
    while peer.wire_ttfa_s(turn) is None:
        await asyncio.sleep(0.01)
    print("playing", flush=True)
    await asyncio.sleep(3600)


if __name__ == "__main__":
    import sys

    asyncio.run(_speak_and_hang(sys.argv[1], sys.argv[2]))
