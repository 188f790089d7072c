"""The reverse-proxy recipe (docs/deployment.md), run: Debian's nginx with ``deploy/nginx.conf`` and a
self-signed certificate in front of ``voicewire serve --base-path /voice`` as a user starts it,
everything on loopback.

Through the proxy: a WebSocket turn, streamed speech, the Origin allow-list, and headless
Chromium loading the page under /voice and playing a turn over WebRTC (signalling through nginx,
media straight to the gateway). The ICE servers given to ``serve`` point at a recording STUN/TURN
endpoint on 127.0.0.1 (``ice_log``), so the test sees both the browser and the gateway's own
peers use them while nothing leaves the host.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from tests.conftest import free_port, speak_turn
from tests.deploy.ice_log import MAPPED_HOST, IceLog, ice_log
from tests.deploy.nginx import NGINX, Nginx, nginx
from tests.deploy.tls import Certificate, self_signed
from tests.realtime.cdp import CHROMIUM, chromium
from voicewire.realtime.client import VoicewireClient, VoicewireError
from voicewire.realtime.client.webrtc import WebRtcClient

pytestmark = pytest.mark.skipif(not Path(NGINX).exists(), reason=f"{NGINX} is not installed")

REPO = Path(__file__).resolve().parents[2]
BASE = "/voice"
# Three loopback addresses, so each hop is told apart: the client connects from CLIENT_ADDRESS,
# nginx connects to the gateway from PROXY_ADDRESS (its proxy_bind), the only trusted proxy.
CLIENT_ADDRESS = "127.0.0.3"
PROXY_ADDRESS = "127.0.0.2"
SPOOFED = "203.0.113.66"  # a documentation address a client claims to be; never contacted
TURN_USER = "voicewire-turn-user"
TURN_SECRET = "turn-secret-from-the-environment"
FOREIGN_ORIGIN = "https://evil.example"
TEXT = "Thanks for calling. Your order shipped this morning and arrives on Thursday."
LONG_TEXT = " ".join(
    [
        "Here is the whole story from the beginning, told slowly so that nothing is missed.",
        "First we checked the warehouse, then the courier, and then the depot near your town.",
        "The parcel had been scanned twice on Monday and once more on Tuesday afternoon.",
        "After that it was loaded onto a van, which broke down on the motorway before noon.",
        "A second van collected everything and the route was changed to start from the north.",
    ]
    * 3
)


@dataclass(frozen=True)
class Deployment:
    proxy: Nginx
    direct_url: str  # http://127.0.0.1:PORT/voice, the gateway without the proxy
    cert: Certificate
    ice: IceLog
    server_log: Path

    def tls(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.cert.cert))

    def log_lines(self) -> list[str]:
        return self.server_log.read_text(errors="replace").splitlines()


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return int(r.status)
    except urllib.error.HTTPError as err:
        return int(err.code)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    directory = tmp_path_factory.mktemp("deploy")
    cert = self_signed(directory)
    port = free_port()
    server_log = directory / "server.log"
    with ice_log() as ice, nginx(cert.cert, cert.key, f"127.0.0.1:{port}", PROXY_ADDRESS) as proxy:
        command = [
            sys.executable, "-m", "voicewire.realtime.cli", "serve",
            "--port", str(port),
            "--base-path", BASE,
            "--trusted-proxy", PROXY_ADDRESS,
            "--allow-origin", proxy.origin,
            "--ice-server", f"stun:127.0.0.1:{ice.port}",
            "--ice-server", f"turn:127.0.0.1:{ice.port}?transport=udp",
            "--ice-username", TURN_USER,
            "--log-format", "json",
            # The engine in the gateway's process: one process less on 2 shared cores, and the
            # deployment knobs are all gateway-side.
            "--replicas", "0",
        ]  # fmt: skip
        env = {**os.environ, "VOICEWIRE_ICE_CREDENTIAL": TURN_SECRET}
        with open(server_log, "wb") as log:
            proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        direct = f"http://127.0.0.1:{port}{BASE}"
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and proc.poll() is None:
                try:
                    if _status(f"{direct}/readyz") == 200:
                        break
                except OSError:
                    pass
                time.sleep(0.1)
            else:
                raise RuntimeError(f"voicewire serve did not get ready: {server_log.read_text()[-3000:]}")
            yield Deployment(proxy, direct, cert, ice, server_log)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _access_lines(deployment: Deployment, path: str) -> list[str]:
    """The gateway's access-log messages for ``path`` (JSON log lines)."""
    out = []
    for line in deployment.log_lines():
        record = json.loads(line) if line.startswith("{") else {}  # print()ed lines are not JSON
        if record.get("logger") == "aiohttp.access" and f" {path}" in record.get("message", ""):
            out.append(record["message"])
    return out


async def _wait_for_access_line(deployment: Deployment, path: str, timeout_s: float = 5.0) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while not (lines := _access_lines(deployment, path)) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return lines


async def test_websocket_turn_through_the_proxy_and_the_log_names_the_client(deployment: Deployment) -> None:
    url = f"{deployment.proxy.url}{BASE}/v1/stream"
    async with await VoicewireClient.connect(
        url,
        ssl=deployment.tls(),
        local_addr=(CLIENT_ADDRESS, 0),
        # What a client claims for itself must not reach the logs: nginx sets the header anew.
        additional_headers={"X-Forwarded-For": SPOOFED},
    ) as client:
        _, audio = await speak_turn(client, TEXT, None)
    assert audio.done.reason == "completed"
    assert audio.done.audio_ms > 2000 and len(audio.data) / 2 / 24_000 * 1000 == pytest.approx(
        audio.done.audio_ms, abs=50
    )

    lines = await _wait_for_access_line(deployment, f"GET {BASE}/v1/stream")
    assert lines, deployment.log_lines()[-20:]
    # The gateway's socket saw nginx (127.0.0.2); its log names the client behind it.
    assert lines[-1].startswith(f"{CLIENT_ADDRESS} GET {BASE}/v1/stream 101"), lines
    assert not any(SPOOFED in line for line in deployment.log_lines())


async def test_speech_streams_through_the_proxy(deployment: Deployment) -> None:
    """Chunks arrive while the body is still being made: the first long before the last."""
    arrivals: list[tuple[float, int]] = []
    connector = aiohttp.TCPConnector(ssl=deployment.tls())
    async with aiohttp.ClientSession(connector=connector) as http:
        t0 = time.perf_counter()
        async with http.post(
            f"{deployment.proxy.url}{BASE}/v1/audio/speech",
            json={"input": LONG_TEXT, "response_format": "pcm"},
        ) as resp:
            assert resp.status == 200, await resp.text()
            assert "Content-Length" not in resp.headers  # chunked: nginx did not gather the body first
            async for data in resp.content.iter_any():
                arrivals.append((time.perf_counter() - t0, len(data)))
    total_bytes = sum(n for _, n in arrivals)
    first_s, last_s = arrivals[0][0], arrivals[-1][0]
    print(f"speech through nginx: first bytes {first_s * 1000:.0f} ms, last {last_s * 1000:.0f} ms, "
          f"{len(arrivals)} reads, {total_bytes / 48_000:.1f} s of audio")  # fmt: skip
    assert total_bytes / 48_000 > 30  # 24 kHz PCM16: over 30 s of audio in all
    assert first_s < 0.25 * last_s, arrivals[:5]
    # Over half of the audio arrived after the first bytes: streamed, not one buffered burst.
    assert sum(n for t, n in arrivals if t > first_s + 0.1 * (last_s - first_s)) > total_bytes / 2


async def test_origin_allow_list_sees_the_browser_origin_through_the_proxy(deployment: Deployment) -> None:
    connector = aiohttp.TCPConnector(ssl=deployment.tls(), local_addr=(CLIENT_ADDRESS, 0))
    base = f"{deployment.proxy.url}{BASE}"
    async with aiohttp.ClientSession(connector=connector) as http:
        for origin, status in ((deployment.proxy.origin, 200), (FOREIGN_ORIGIN, 403)):
            async with http.get(f"{base}/v1/rtc-configuration", headers={"Origin": origin}) as r:
                assert r.status == status, await r.text()
        async with http.post(f"{base}/offer", json={}, headers={"Origin": FOREIGN_ORIGIN}) as r:
            assert r.status == 403 and (await r.json())["error"]["code"] == "origin_not_allowed"
        # The page's own origin passes admission and reaches the offer's validation.
        async with http.post(f"{base}/offer", json={}, headers={"Origin": deployment.proxy.origin}) as r:
            assert r.status == 400 and (await r.json())["error"]["code"] == "invalid_type"
        async with http.post(
            f"{base}/v1/audio/speech", json={"input": "Hi."}, headers={"Origin": FOREIGN_ORIGIN}
        ) as r:
            assert r.status == 403
    with pytest.raises(VoicewireError) as refused:
        await VoicewireClient.connect(f"{base}/v1/stream", ssl=deployment.tls(), origin=FOREIGN_ORIGIN)
    assert refused.value.code == "origin_not_allowed"
    # The refusals name the client behind the proxy, not nginx.
    refusals = [line for line in deployment.log_lines() if f"refused POST {BASE}/offer from" in line]
    assert refusals and all(f"from {CLIENT_ADDRESS}: origin_not_allowed" in line for line in refusals), refusals


async def test_metrics_stay_off_the_public_proxy(deployment: Deployment) -> None:
    connector = aiohttp.TCPConnector(ssl=deployment.tls())
    async with aiohttp.ClientSession(connector=connector) as http:
        async with http.get(f"{deployment.proxy.url}{BASE}/metrics") as r:
            assert r.status == 404
        async with http.get(f"{deployment.direct_url}/metrics") as r:  # the scraper's way in
            assert r.status == 200 and "voicewire_sessions_active" in await r.text()


def _srflx(sdp: str) -> list[str]:
    return [line for line in sdp.splitlines() if line.startswith("a=candidate:") and " typ srflx" in line]


async def test_the_gateways_peers_use_the_ice_servers_it_was_given(deployment: Deployment) -> None:
    """The server's aiortc peer asks the STUN server (its answer carries the server-reflexive
    candidate only that server could name) and the TURN server with the configured username."""
    deployment.ice.binding_from.clear()
    deployment.ice.turn_usernames.clear()
    client = await WebRtcClient.connect(deployment.direct_url)  # the client itself uses no ICE server
    try:
        answer = client.answer_sdp
    finally:
        await client.close()
    assert any(f" {MAPPED_HOST} " in line for line in _srflx(answer)), answer
    assert deployment.ice.binding_from and TURN_USER in deployment.ice.turn_usernames


SAMPLE_STATS_JS = """
(async (ms) => {
  const out = [];
  const t0 = performance.now();
  while (performance.now() - t0 < ms) {
    const s = await voicewire.audioStats();
    out.push({t: performance.now(), samples: s.totalSamplesReceived, level: s.audioLevel});
    await new Promise((r) => setTimeout(r, 50));
  }
  return out;
})(%d)
"""


@pytest.mark.browser
@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} is not installed")
async def test_browser_plays_a_turn_from_the_page_under_the_sub_path(deployment: Deployment) -> None:
    proxy = deployment.proxy
    # Trust exactly the test certificate, nothing else (no blanket --ignore-certificate-errors).
    flags = (f"--ignore-certificate-errors-spki-list={deployment.cert.spki_sha256}",)
    async with chromium(extra_flags=flags) as page:
        await page.goto(f"{proxy.url}{BASE}")  # as typed: without the slash
        assert await page.eval("location.href") == f"{proxy.url}{BASE}/"
        assert await page.eval("voicewire.baseUrl") == f"{proxy.url}{BASE}/"
        # The stylesheet came through the sub-path too.
        assert await page.eval("getComputedStyle(document.body).margin") == "0px"
        await page.eval("document.getElementById('connect').click()")
        await page.wait_for("voicewire.state.connected", 15)
        ice_servers = await page.eval("voicewire.state.pc.getConfiguration().iceServers")
        offer = await page.eval("voicewire.state.pc.localDescription.sdp")
        answer = await page.eval("voicewire.state.pc.remoteDescription.sdp")
        await asyncio.sleep(0.5)  # the jitter buffer settles before the turn (chromium-webrtc.md T15)
        before = await page.eval("voicewire.audioStats()")
        await page.eval(f"voicewire.speak({json.dumps(TEXT)}, {{mode: 'whole'}})")
        playing = await page.eval(SAMPLE_STATS_JS % 2000)
        await page.goto("about:blank")

    assert before["playError"] is None and before["codec"] == "audio/opus"
    first, last = playing[0], playing[-1]
    rate = (last["samples"] - first["samples"]) / (last["t"] - first["t"])
    assert rate > 0.9 * 48, f"inbound samples grow at {rate:.1f}/ms"
    assert max(s["level"] for s in playing) > 0.01
    # The page took its ICE servers from the gateway, credential included, and used them: its
    # offer carries a server-reflexive candidate that only the loopback STUN endpoint names.
    by_scheme = {s["urls"][0].split(":")[0]: s for s in ice_servers}
    assert by_scheme["stun"]["urls"] == [f"stun:127.0.0.1:{deployment.ice.port}"]
    assert by_scheme["turn"]["username"] == TURN_USER and by_scheme["turn"]["credential"] == TURN_SECRET
    assert any(f" {MAPPED_HOST} " in line for line in _srflx(offer)), offer
    assert _srflx(answer), answer
    # Signalling came through nginx: the page's offer is in the proxy's log and the gateway's.
    assert await _wait_for_access_line(deployment, f"POST {BASE}/offer")
    assert f"POST {BASE}/offer" in (proxy.prefix / "access.log").read_text()
