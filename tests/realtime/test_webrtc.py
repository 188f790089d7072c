"""WebRTC against the real gateway and voice: aiortc client peers on loopback, no mocks.

Timing is read from RTP packet arrivals at the client (before aiortc's 80 ms jitter buffer);
intelligibility from the audio aiortc's own receive path decoded, transcribed by Whisper tiny.en.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest

from tests.asr import transcribe, wer
from tests.conftest import wait_engine_idle
from tests.realtime.gateway import gateway, wait_gone
from voicewire.engine import ONSET_THRESHOLD_DBFS, Engine
from voicewire.realtime.client import Turn
from voicewire.realtime.client.simulated_llm import send_reply
from voicewire.realtime.client.webrtc import FRAME_SAMPLES, WebRtcClient
from voicewire.realtime.config import GatewayConfig
from voicewire.realtime.gateway import GATEWAY
from voicewire.realtime.webrtc import filter_candidates

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "artifacts"
TURNS = [
    "Hello, thanks for calling. How can I help you today?",
    "Sure, your order number is 4521, and it will arrive on Friday.",
]
PEER_TURNS = [
    "Good morning, the weather today is sunny and warm.",
    "Your table for four is booked at seven tonight.",
    "Please remember to bring your passport to the airport.",
    "The library closes at nine on weekdays.",
    "I have moved your meeting to Thursday afternoon.",
    "The blue train leaves from platform three.",
    "Your package was delivered to the front desk.",
    "We will call you back within the hour.",
    "The museum is free on the first Sunday of the month.",
    "Thank you for waiting, your doctor will see you now.",
]
LONG_TURN = (
    "Let me walk you through the whole process step by step, so nothing is missed. "
    "First, open the settings page and find the section called account details. "
    "Then choose the option to update your address, and save the changes when you are done."
)
MAX_WER = 0.15
MAX_P99_INTER_ARRIVAL_S = 0.030
CLEANUP_S = 2.0
# A peer process that starts a turn, says "playing" once its audio arrives, then waits to be killed.
HANGING_PEER = """
import asyncio, sys
from voicewire.realtime.client.simulated_llm import send_reply
from voicewire.realtime.client.webrtc import WebRtcClient
async def main():
    peer = await WebRtcClient.connect(sys.argv[1])
    turn = await peer.start_turn()
    await send_reply(turn, sys.argv[2], 50)
    while peer.wire_ttfa_s(turn) is None:
        await asyncio.sleep(0.01)
    print("playing", flush=True)
    await asyncio.sleep(3600)
asyncio.run(main())
"""


async def _speak(peer: WebRtcClient, text: str, words_per_s: float, turn_id: str | int | None = None) -> Turn:
    """One simulated LLM reply, one word per text.delta; returns once text.end is sent."""
    turn = await peer.start_turn(turn_id)
    await send_reply(turn, text, words_per_s)
    return turn


async def _hyp(turn: Turn) -> str:
    """The turn's audio as aiortc's receive path decoded it, transcribed."""
    pcm = (await turn.collect(timeout_s=5)).pcm()
    return await asyncio.to_thread(transcribe, pcm, 48_000)


def _write_artifact(name: str, data: dict[str, Any]) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / name).write_text(json.dumps(data, indent=2))


async def test_two_turns_are_intelligible_paced_and_fast(engine: Engine) -> None:
    async with gateway(engine) as gw:
        peer = await WebRtcClient.connect(gw.url)
        assert peer.session["audio"] == {"format": "opus", "sample_rate": 48_000, "channels": 1}
        assert " 127.0.0.1 " in peer.answer_sdp, "the answer must offer a loopback candidate (T1)"
        turns = []
        for i, text in enumerate(TURNS):
            turns.append(await _speak(peer, text, 25, i))
            await turns[-1].done(30)
        await asyncio.sleep(0.2)  # the last frames out of aiortc's jitter buffer
        await peer.close()

    report: dict[str, Any] = {"turns": []}
    for text, turn in zip(TURNS, turns, strict=True):
        done = turn.result
        assert done is not None and done.reason == "completed"
        pkts = peer.turn_packets(turn)
        # exact 20 ms frames, contiguous RTP clock
        assert {p.samples for p in pkts} == {FRAME_SAMPLES}
        assert set(np.diff([p.pts for p in pkts])) == {FRAME_SAMPLES}
        gaps_s = peer.audible_inter_arrivals_s(turn)
        p99_s = float(np.percentile(gaps_s, 99))
        assert p99_s <= MAX_P99_INTER_ARRIVAL_S, (
            f"p99 inter-arrival {p99_s * 1000:.1f} ms: a burst or a stall"
        )
        # paced on the wall clock: the audio took as long to arrive as it lasts (each end's arrivals
        # against the RTP clock, a median of 10: one packet the 2 shared cores held up is not a drift)
        audible = [p for p in pkts if p.level_dbfs > ONSET_THRESHOLD_DBFS]
        behind_s = [p.t_arrival_s - p.pts / 48_000 for p in audible]
        assert len(behind_s) > 100
        assert np.median(behind_s[-10:]) == pytest.approx(np.median(behind_s[:10]), abs=0.03)
        # turn.done follows the audio, and reports what was paced out
        assert turn.t_done_s is not None and turn.t_done_s >= audible[-1].t_arrival_s
        assert done.played_ms == pytest.approx(done.audio_ms, abs=1.0)
        ttfa_s = peer.wire_ttfa_s(turn)
        assert ttfa_s is not None and ttfa_s < 0.5
        hyp = await _hyp(turn)
        assert wer(text, hyp) <= MAX_WER, (text, hyp)
        report["turns"].append(
            {
                "text": text,
                "hypothesis": hyp,
                "wire_ttfa_ms": round(ttfa_s * 1000, 1),
                "server_metrics": done.metrics,
                "inter_arrival_ms": {
                    "p50": round(float(np.percentile(gaps_s, 50)) * 1000, 2),
                    "p99": round(p99_s * 1000, 2),
                    "max": round(float(gaps_s.max()) * 1000, 2),
                },
            }
        )
        print(
            f"turn {turn.turn_id}: wire TTFA {ttfa_s * 1000:.1f} ms, p99 inter-arrival {p99_s * 1000:.1f} ms"
        )
    _write_artifact("webrtc_two_turns.json", report)


async def test_ten_concurrent_peers_each_hear_their_own_turn(engine: Engine) -> None:
    async with gateway(engine) as gw:
        peers = list(await asyncio.gather(*(WebRtcClient.connect(gw.url) for _ in PEER_TURNS)))

        async def talk(peer: WebRtcClient, i: int, text: str) -> Turn:
            turn = await _speak(peer, text, 25, f"p{i}")
            await turn.done(30)
            return turn

        turns = await asyncio.gather(*(talk(p, i, t) for i, (p, t) in enumerate(zip(peers, PEER_TURNS, strict=True))))
        await asyncio.sleep(0.2)
        await asyncio.gather(*(p.close() for p in peers))
        await wait_gone(engine, gw, CLEANUP_S)

    ttfas_ms, p99s_ms = [], []
    for peer, turn, text in zip(peers, turns, PEER_TURNS, strict=True):
        assert turn.result is not None and turn.result.reason == "completed"
        hyp = await _hyp(turn)
        assert wer(text, hyp) <= MAX_WER, (text, hyp)
        ttfa_s = peer.wire_ttfa_s(turn)
        assert ttfa_s is not None
        ttfas_ms.append(ttfa_s * 1000)
        p99s_ms.append(float(np.percentile(peer.audible_inter_arrivals_s(turn), 99)) * 1000)
    # The turns overlapped: every peer was hearing audio at the same time.
    starts = [
        min(p.t_arrival_s for p in peer.turn_packets(t) if p.level_dbfs > ONSET_THRESHOLD_DBFS)
        for peer, t in zip(peers, turns, strict=True)
    ]
    ends = [t.t_done_s for t in turns]
    assert max(starts) < min(e for e in ends if e is not None)
    print(
        f"10 peers: wire TTFA ms {sorted(round(x) for x in ttfas_ms)}, p99 inter-arrival ms max {max(p99s_ms):.1f}"
    )
    _write_artifact("webrtc_ten_peers.json", {"wire_ttfa_ms": ttfas_ms, "p99_inter_arrival_ms": p99s_ms})


async def test_barge_in_clears_queued_audio_within_one_frame(engine: Engine) -> None:
    async with gateway(engine) as gw:
        peer = await WebRtcClient.connect(gw.url)
        turn = await _speak(peer, LONG_TURN, 60, "long")  # all text in: the engine has queued seconds of audio
        while peer.wire_ttfa_s(turn) is None:
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.5)
        t_cancel = time.perf_counter()
        await turn.send_cancel()
        done = await turn.done(30)
        await asyncio.sleep(0.3)
        # One 20 ms slot to notice, one packet whose Opus lookahead still holds the cut audio,
        # a few ms of transport: nothing audible may arrive 60 ms after the cancel was sent.
        late = [
            p for p in peer.packets if p.t_arrival_s > t_cancel + 0.060 and p.level_dbfs > ONSET_THRESHOLD_DBFS
        ]
        assert not late, f"audible audio {(late[0].t_arrival_s - t_cancel) * 1000:.0f} ms after the cancel"
        assert done.reason == "cancelled"
        assert 400 < done.played_ms < done.audio_ms - 1000
        assert turn.t_done_s is not None and turn.t_done_s - t_cancel < 0.1
        # the session goes on: a new turn plays
        nxt = await _speak(peer, TURNS[0], 30, "next")
        assert (await nxt.done(30)).reason == "completed"
        await asyncio.sleep(0.2)
        await peer.close()
        await wait_gone(engine, gw, CLEANUP_S)
    assert wer(TURNS[0], await _hyp(nxt)) <= MAX_WER


async def test_peer_closed_mid_turn_without_goodbye_leaves_nothing_behind(engine: Engine) -> None:
    async with gateway(engine) as gw:
        peer = await WebRtcClient.connect(gw.url)
        turn = await _speak(peer, LONG_TURN, 60)
        while peer.wire_ttfa_s(turn) is None:
            await asyncio.sleep(0.005)
        assert gw.sessions and engine.active_streams() >= 1
        await peer.pc.close()  # no turn.cancel, no protocol goodbye
        gone_s = await wait_gone(engine, gw, CLEANUP_S)
        print(f"peer closed mid-turn: session and engine stream freed in {gone_s * 1000:.0f} ms")


async def test_killed_peer_process_is_found_by_ice_consent(engine: Engine) -> None:
    """A client that vanishes with no packet at all (SIGKILL): only ICE consent can tell."""
    interval_s, failures = 0.25, 2  # ~2 x (0.25 + 0.5 s timeout): found in ~1.5 s
    async with gateway(engine, ice_consent_interval_s=interval_s, ice_consent_failures=failures) as gw:
        proc = subprocess.Popen(
            [sys.executable, "-c", HANGING_PEER, gw.url, LONG_TURN],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        try:
            assert proc.stdout is not None
            line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 30)
            assert line.strip() == b"playing"
            assert gw.sessions and engine.active_streams() >= 1
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        detect_s = failures * (interval_s * 1.2 + 0.5)
        gone_s = await wait_gone(engine, gw, detect_s + CLEANUP_S)
        print(f"killed peer: freed {gone_s * 1000:.0f} ms after SIGKILL (consent budget {detect_s:.2f} s)")


async def test_server_shutdown_closes_connected_peers(engine: Engine) -> None:
    async with gateway(engine) as gw:
        peers = list(await asyncio.gather(*(WebRtcClient.connect(gw.url) for _ in range(2))))
        await _speak(peers[0], LONG_TURN, 60)
        app = gw.app
    # runner.cleanup() has returned: every peer and session is gone, their streams cancelled (the
    # engine frees a cancelled stream's slot on its next tick: a busy machine's tick can be late)
    assert not app[GATEWAY].peers and not app[GATEWAY].sessions
    await wait_engine_idle(engine, timeout_s=5)
    for p in peers:
        for _ in range(100):
            if p.pc.connectionState == "closed" or p.channel.readyState == "closed":
                break
            await asyncio.sleep(0.02)
        assert p.channel.readyState == "closed"
        await p.close()


def _offer_sdp(audio: bool = True, data: bool = True) -> str:
    lines = ["v=0", "o=- 1 1 IN IP4 127.0.0.1", "s=-", "t=0 0"]
    if audio:
        lines += [
            "m=audio 9 UDP/TLS/RTP/SAVPF 111",
            "c=IN IP4 0.0.0.0",
            "a=rtpmap:111 opus/48000/2",
            "a=recvonly",
        ]
    if data:
        lines += ["m=application 9 UDP/DTLS/SCTP webrtc-datachannel", "c=IN IP4 0.0.0.0"]
    return "\r\n".join(lines) + "\r\n"


async def test_bad_offers_get_4xx_json_errors(engine: Engine) -> None:
    client = WebRtcClient()
    client.pc.addTransceiver("audio", direction="recvonly")
    client.pc.createDataChannel("control")
    await client.pc.setLocalDescription(await client.pc.createOffer())
    real = client.pc.localDescription.sdp
    no_ufrag = "".join(line for line in real.splitlines(keepends=True) if not line.startswith("a=ice-ufrag"))
    no_fingerprint = "".join(
        line for line in real.splitlines(keepends=True) if not line.startswith("a=fingerprint")
    )
    cases: list[tuple[Any, str, int, str]] = [
        ("not json", "application/json", 400, "invalid_json"),
        ("[1, 2]", "application/json", 400, "invalid_request"),
        (json.dumps({"sdp": real}), "application/json", 400, "invalid_type"),
        (json.dumps({"sdp": real, "type": "answer"}), "application/json", 400, "invalid_type"),
        (json.dumps({"type": "offer"}), "application/json", 400, "invalid_sdp"),
        (json.dumps({"sdp": 42, "type": "offer"}), "application/json", 400, "invalid_sdp"),
        (json.dumps({"sdp": "hello", "type": "offer"}), "application/json", 400, "invalid_sdp"),
        (json.dumps({"sdp": _offer_sdp(audio=False), "type": "offer"}), "application/json", 400, "no_audio"),
        (
            json.dumps({"sdp": _offer_sdp(data=False), "type": "offer"}),
            "application/json",
            400,
            "no_data_channel",
        ),
        (json.dumps({"sdp": _offer_sdp(), "type": "offer"}), "application/json", 400, "invalid_sdp"),
        (json.dumps({"sdp": no_ufrag, "type": "offer"}), "application/json", 400, "invalid_sdp"),
        (json.dumps({"sdp": no_fingerprint, "type": "offer"}), "application/json", 400, "invalid_sdp"),
        (json.dumps({"sdp": real, "type": "offer"}), "text/plain", 415, "unsupported_media_type"),
        # offers aiortc's SDP parser or setRemoteDescription chokes on
        *(
            (json.dumps({"sdp": bad, "type": "offer"}), "application/json", 400, "invalid_sdp")
            for bad in (
                real.replace("a=rtpmap:", "a=rtpmap:zz"),
                real.replace("a=end-of-candidates", "a=candidate:abc"),
                real.replace("a=fingerprint:sha-256 ", "a=fingerprint:"),
                real.replace("c=IN IP4", "c=IN"),
                real.replace("a=sctp-port:5000", "a=sctp-port:x"),
                real + "a=ssrc:x\r\n",
            )
        ),
        (
            json.dumps(
                {
                    "sdp": real.replace(
                        "a=end-of-candidates",
                        "".join(f"a=candidate:{i} 1 udp 2122260223 127.0.0.{i} 5000 typ host\r\n" for i in range(GatewayConfig.max_offer_candidates + 1))
                        + "a=end-of-candidates",
                    ),
                    "type": "offer",
                }
            ),
            "application/json",
            400,
            "too_many_candidates",
        ),
        ('{"sdp": ' + "[" * 30_000 + "]" * 30_000 + "}", "application/json", 400, "invalid_json"),
        ('{"sdp": ' + "[" * 5_000 + "]" * 5_000 + ', "type": "offer"}', "application/json", 400, "invalid_json"),
        ('{"sdp": ' + "9" * 5_000 + ', "type": "offer"}', "application/json", 400, "invalid_json"),
        (
            json.dumps({"sdp": real + "a=x\r\n" * 10_000, "type": "offer"}),
            "application/json",
            413,
            "body_too_large",
        ),
    ]
    async with gateway(engine) as gw, aiohttp.ClientSession() as http:
        for body, ctype, status, code in cases:
            async with http.post(f"{gw.url}/offer", data=body, headers={"Content-Type": ctype}) as resp:
                assert resp.status == status, (body[:80], resp.status, await resp.text())
                err = (await resp.json())["error"]
                assert err["code"] == code, (body[:80], err)
        assert not gw.peers and not gw.sessions
        # the same real offer is then accepted
        async with http.post(f"{gw.url}/offer", json={"sdp": real, "type": "offer"}) as resp:
            assert resp.status == 200 and (await resp.json())["type"] == "answer"
    await client.close()


def test_only_unicast_candidates_of_the_servers_families_are_kept() -> None:
    keep = "a=candidate:2 1 udp 2122260223 127.0.0.1 5000 typ host\r\n"
    dropped = [
        "a=candidate:3 1 udp 2122260223 ::1 5000 typ host\r\n",  # IPv6 to a server gathering IPv4 only
        "a=candidate:4 1 udp 2122260223 224.0.0.251 5353 typ host\r\n",  # multicast
        "a=candidate:5 1 udp 2122260223 0.0.0.0 9 typ host\r\n",  # unspecified
        "a=candidate:6 1 udp 2122260223 victim.example 80 typ host\r\n",  # a name to look up
        "a=candidate:7 1 udp\r\n",  # truncated
    ]
    assert filter_candidates("v=0\r\n" + keep + "".join(dropped), {4}) == "v=0\r\n" + keep
    assert filter_candidates(dropped[0], {4, 6}) == dropped[0]


async def test_mdns_candidates_are_dropped_and_do_not_delay_the_answer(engine: Engine) -> None:
    sdp = "v=0\r\na=candidate:1 1 udp 2122260223 3c1f9a1e-1111-4d2b-9c3e-0123456789ab.local 54321 typ host\r\na=candidate:2 1 udp 2122260223 127.0.0.1 5000 typ host\r\n"
    assert filter_candidates(sdp, {4}) == "v=0\r\na=candidate:2 1 udp 2122260223 127.0.0.1 5000 typ host\r\n"
    client = WebRtcClient()
    client.pc.addTransceiver("audio", direction="recvonly")
    client.channel = client.pc.createDataChannel("control")
    await client.pc.setLocalDescription(await client.pc.createOffer())
    mdns = "a=candidate:9 1 udp 2122260223 3c1f9a1e-1111-4d2b-9c3e-0123456789ab.local 54321 typ host\r\n"
    offer = client.pc.localDescription.sdp.replace(
        "a=end-of-candidates\r\n", mdns + "a=end-of-candidates\r\n"
    )
    async with gateway(engine) as gw, aiohttp.ClientSession() as http:
        t0 = time.perf_counter()
        async with http.post(f"{gw.url}/offer", json={"sdp": offer, "type": "offer"}) as resp:
            assert resp.status == 200
        answer_s = time.perf_counter() - t0
        assert answer_s < 0.5, f"answer took {answer_s * 1000:.0f} ms (aioice resolving .local takes 1 s)"
    await client.close()
