"""Slow consumers: clients that stop reading are closed with 4008, memory stays bounded, and a
normal client playing at the same time never underruns. Runs ~20 s against a server process."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import websockets

from tests.conftest import free_port, speak_turn
from voicewire.realtime.client import TurnAudio, VoicewireClient
from voicewire.realtime.client.listener import playout, ws_arrivals

STALL_MAX_S = 30.0  # the server closes them after its write stall timeout (10 s); this is the bound
STALLED_CLIENTS = 10
RSS_GROWTH_BOUND_MB = 100.0  # stated bound for 10 stalled clients (docs/security.md, "Backpressure")
LONG_TEXT = "This is a long answer that the client never reads, sentence after sentence after sentence. " * 30
NORMAL_TEXT = "Here is a normal answer, played in real time, while other clients misbehave."

pytestmark = pytest.mark.slow


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def _sessions(base: str) -> int:
    with urllib.request.urlopen(f"http://{base}/healthz", timeout=5) as r:
        return int(json.loads(r.read())["sessions"])


async def _stalled_client(base: str) -> websockets.ClientConnection:
    host, port = base.split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)  # a small window: the stall shows quickly
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
    ws = await websockets.connect(f"ws://{base}/v1/stream", sock=sock, max_queue=1, max_size=None)
    await ws.send(json.dumps({"type": "text.delta", "turn_id": 1, "text": LONG_TEXT}))
    await ws.send(json.dumps({"type": "text.end", "turn_id": 1}))
    return ws  # ...and never read from it while the stall lasts


async def _drain_until_closed(ws: websockets.ClientConnection) -> int | None:
    try:
        while True:
            await asyncio.wait_for(ws.recv(), 10)
    except websockets.ConnectionClosed as closed:
        return closed.rcvd.code if closed.rcvd is not None else None


async def test_slow_consumers_are_closed_and_do_not_hurt_others() -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "voicewire.realtime.cli", "serve", "--port", str(port), "--log-level", "warning"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    base = f"127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://{base}/readyz", timeout=1)
                break
            except OSError:
                await asyncio.sleep(0.1)
        normal = await VoicewireClient.connect(f"ws://{base}")
        await speak_turn(normal, NORMAL_TEXT, 30, "warm")
        rss0 = _rss_mb(proc.pid)

        stalled = [await _stalled_client(base) for _ in range(STALLED_CLIENTS)]
        t0 = time.monotonic()
        rss_max = rss0
        turns: list[TurnAudio] = []
        i = 0
        # the normal client plays until the server has let go of every stalled session
        while _sessions(base) > 1:
            assert time.monotonic() - t0 < STALL_MAX_S, "the stalled clients were not closed"
            _, heard = await speak_turn(normal, NORMAL_TEXT, 30, f"n{i}")
            turns.append(heard)
            rss_max = max(rss_max, _rss_mb(proc.pid))
            i += 1
        codes = await asyncio.gather(*(_drain_until_closed(ws) for ws in stalled))

        assert codes == [4008] * STALLED_CLIENTS, codes
        assert rss_max - rss0 <= RSS_GROWTH_BOUND_MB, f"RSS grew {rss_max - rss0:.0f} MB"
        assert len(turns) >= 5
        for heard in turns:
            assert heard.done.reason == "completed"
            assert heard.done.metrics["underruns"] == 0
            # client side: playback from the first byte (20 ms of slack) never ran dry
            played = playout(ws_arrivals(heard.chunks), 24_000, buffer_s=0.02)
            assert played.underruns == 0, "the normal client's playback ran dry"
        assert _sessions(base) == 1  # only the normal client is left
        await normal.close()
        print(f"RSS {rss0:.0f} MB -> max {rss_max:.0f} MB; {len(turns)} normal turns; closes {codes[0]}")
    finally:
        proc.terminate()
        proc.wait(20)

