"""The deployment flags of ``voicewire serve`` one by one, on a gateway in this process: the base
path, trusted proxies, TLS on the port itself, and ICE servers down to what aiortc's peer
connection and the browser's ``RTCPeerConnection`` are given. No packet leaves the host: the ICE
servers here use ``.invalid`` names (RFC 2606), which nothing resolves, and no peer gathers."""

from __future__ import annotations

import contextlib
import logging
import re
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiortc.rtcicetransport import connection_kwargs
from multidict import CIMultiDict, CIMultiDictProxy

from tests.conftest import speak_turn
from tests.deploy.tls import self_signed
from voicewire.engine import Engine, EngineConfig
from voicewire.realtime.cli import build_parser
from voicewire.realtime.config import GatewayConfig, IceServer, parse_networks
from voicewire.realtime.proxy import resolve
from voicewire.realtime.server import create_app, make_runner, tls_context
from voicewire.realtime.webrtc import rtc_configuration

pytestmark = pytest.mark.shared_cores  # flags, paths and headers: nothing timed

REPO = Path(__file__).resolve().parents[2]
STUN = "stun:stun.example.invalid:3478"
TURN_UDP = "turn:turn.example.invalid:3478?transport=udp"
TURN_TCP = "turns:turn.example.invalid:5349?transport=tcp"


@contextlib.asynccontextmanager
async def served(engine: Engine, tls: ssl.SSLContext | None = None, **config: Any) -> AsyncIterator[str]:
    """The app on 127.0.0.1 (free port); yields its base URL (scheme, host, port, base path)."""
    cfg = GatewayConfig(**config)
    app = create_app(cfg, engine=engine)
    runner = make_runner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"{'https' if tls else 'http'}://127.0.0.1:{port}{cfg.base_path}"
    finally:
        await runner.cleanup()


async def _get_json(url: str, headers: dict[str, str] | None = None) -> tuple[int, Any, Any]:
    async with aiohttp.ClientSession() as http, http.get(url, headers=headers) as r:
        return r.status, r.headers, await r.json()


def _serve(*flags: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``voicewire serve`` with flags that must be refused before any model loads."""
    return subprocess.run(
        [sys.executable, "-m", "voicewire.realtime.cli", "serve", "--port", "1", *flags],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


# --- ICE servers ------------------------------------------------------------------------------------
def _ice_config(*flags: str) -> GatewayConfig:
    from voicewire.realtime.cli import _ice_servers

    return GatewayConfig(ice_servers=_ice_servers(build_parser().parse_args(["serve", *flags])))


async def test_ice_servers_reach_the_peer_connection_and_the_page() -> None:
    config = _ice_config(
        "--ice-server", STUN, "--ice-server", TURN_UDP, "--ice-server", TURN_TCP,
        "--ice-username", "alice", "--ice-credential", "s3cret",
    )  # fmt: skip
    assert config.ice_servers == (
        IceServer((STUN,)),
        IceServer((TURN_UDP, TURN_TCP), username="alice", credential="s3cret"),
    )
    # What aiortc's ICE gatherer is built from for each of the server's peers (it takes one STUN
    # and one TURN server: the first of each).
    used = connection_kwargs(rtc_configuration(config).iceServers or [])
    assert used["stun_server"] == ("stun.example.invalid", 3478)
    assert used["turn_server"] == ("turn.example.invalid", 3478) and used["turn_transport"] == "udp"
    assert (used["turn_username"], used["turn_password"]) == ("alice", "s3cret")
    # What the page passes to new RTCPeerConnection (an engine that never starts: the endpoint
    # does not need one).
    async with served(Engine(EngineConfig()), ice_servers=config.ice_servers) as base:
        status, headers, body = await _get_json(f"{base}/v1/rtc-configuration")
    assert status == 200 and headers["Cache-Control"] == "no-store"
    assert body["iceServers"] == [
        {"urls": [STUN]},
        {"urls": [TURN_UDP, TURN_TCP], "username": "alice", "credential": "s3cret"},
    ]
    assert (body["authRequired"], body["tokenUrl"]) == (False, None)  # the demo page's own needs


async def test_no_ice_server_by_default_means_none_at_all() -> None:
    config = _ice_config()
    # iceServers [] and not None: aiortc's default for None is a public STUN server.
    assert rtc_configuration(config).iceServers == [] and connection_kwargs([]) == {}
    async with served(Engine(EngineConfig())) as base:
        assert (await _get_json(f"{base}/v1/rtc-configuration"))[2]["iceServers"] == []


def test_the_turn_credential_can_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VOICEWIRE_ICE_CREDENTIAL", "from-env")
    config = _ice_config("--ice-server", TURN_UDP, "--ice-username", "bob")
    assert config.ice_servers == (IceServer((TURN_UDP,), username="bob", credential="from-env"),)


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (("--ice-server", TURN_UDP), "needs --ice-username and --ice-credential"),
        (("--ice-server", "https://stun.example.invalid"), "give a stun:"),
        (("--ice-server", STUN, "--ice-username", "u"), "apply to a turn:"),
        (("--ice-server", "stun:"), "malformed ICE server url"),
        (("--ice-server", "turn:host:port", "--ice-username", "u", "--ice-credential", "c"), "malformed"),
        (("--tls-cert", "cert.pem"), "--tls-cert and --tls-key go together"),
        (("--base-path", "/../etc"), "base path"),
        (("--trusted-proxy", "proxy.example.invalid"), "IP address or a network"),
    ],
)
def test_serve_refuses_flags_that_cannot_work_in_one_line(flags: tuple[str, ...], says: str) -> None:
    proc = _serve(*flags)
    assert proc.returncode == 2 and says in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_serve_refuses_a_certificate_it_cannot_load_in_one_line(tmp_path: Path) -> None:
    cert = self_signed(tmp_path)
    missing = _serve("--tls-cert", str(tmp_path / "nope.pem"), "--tls-key", str(cert.key))
    assert missing.returncode == 1 and "cannot load --tls-cert" in missing.stderr, missing.stderr
    swapped = _serve("--tls-cert", str(cert.key), "--tls-key", str(cert.cert))
    assert swapped.returncode == 1 and "cannot load --tls-cert" in swapped.stderr, swapped.stderr


# --- base path ----------------------------------------------------------------------------------------
async def test_every_route_follows_the_base_path() -> None:
    async with served(Engine(EngineConfig()), base_path="/voice") as base, aiohttp.ClientSession() as http:
        root = base.removesuffix("/voice")
        for path in (
            "/healthz",
            "/health",
            "/readyz",
            "/v1/rtc-configuration",
            "/static/app.js",
            "/static/style.css",
            "/",
        ):
            async with http.get(f"{base}{path}") as r:
                # /readyz is 503 (the engine is not started here): routed, not missing.
                assert r.status == (503 if path == "/readyz" else 200), path
            async with http.get(f"{root}{path}") as r:
                assert r.status == 404, path
        async with http.get(base, allow_redirects=False) as r:
            # The page's relative asset URLs resolve against /voice/, not /voice.
            assert r.status == 308 and r.headers["Location"] == "/voice/"
        for path in ("/offer", "/v1/audio/speech"):
            async with http.post(f"{base}{path}", json={}) as r:
                assert r.status == 503 and (await r.json())["error"]["code"] == "not_ready", path
            async with http.post(f"{root}{path}", json={}) as r:
                assert r.status == 404, path
        async with http.get(f"{base}/") as r:
            page = await r.text()
        # The page names no absolute path of its own: it works under any base.
        assert not re.search(r'(?:src|href)="/', page)
        async with http.get(f"{base}/static/app.js") as r:
            script = await r.text()
        assert not re.search(r"""fetch\(\s*["'`]/""", script)


# --- trusted proxies ----------------------------------------------------------------------------------
def _headers(**values: str) -> CIMultiDictProxy[str]:
    return CIMultiDictProxy(CIMultiDict({k.replace("_", "-"): v for k, v in values.items()}))


def test_forwarded_headers_are_believed_from_trusted_proxies_only() -> None:
    proxies = parse_networks(("127.0.0.1", "10.0.0.0/8"))
    headers = _headers(
        X_Forwarded_For="198.51.100.7", X_Forwarded_Proto="https", X_Forwarded_Host="voice.example.com"
    )
    assert resolve("192.0.2.1", headers, proxies) is None  # the peer is no proxy of ours
    assert resolve("192.0.2.1", headers, ()) is None  # off by default
    forwarded = resolve("127.0.0.1", headers, proxies)
    assert forwarded is not None
    assert (forwarded.remote, forwarded.scheme, forwarded.host) == (
        "198.51.100.7",
        "https",
        "voice.example.com",
    )
    # Right to left through the trusted hops: what the client wrote itself (leftmost) is not taken.
    chain = _headers(X_Forwarded_For="203.0.113.9, 198.51.100.7, 10.1.2.3")
    assert resolve("127.0.0.1", chain, proxies).remote == "198.51.100.7"  # type: ignore[union-attr]
    # Garbage stops the walk at the last address that could be believed.
    assert resolve("127.0.0.1", _headers(X_Forwarded_For="unknown, 10.1.2.3"), proxies).remote == "10.1.2.3"  # type: ignore[union-attr]
    assert resolve("::ffff:127.0.0.1", headers, proxies) is not None  # an IPv4 proxy on a dual-stack socket
    odd = resolve("127.0.0.1", _headers(X_Forwarded_Proto="gopher", X_Forwarded_Host="a b/c"), proxies)
    assert odd is not None and (odd.remote, odd.scheme, odd.host) == ("127.0.0.1", None, None)


@pytest.mark.parametrize("trusted", [(), ("192.0.2.0/24",), ("127.0.0.1",)])
async def test_the_access_log_names_the_forwarded_client_only_behind_a_trusted_proxy(
    trusted: tuple[str, ...], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="aiohttp.access")
    async with served(Engine(EngineConfig()), trusted_proxies=trusted) as base:
        status, _, _ = await _get_json(f"{base}/healthz", {"X-Forwarded-For": "198.51.100.7"})
    assert status == 200
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "aiohttp.access"]
    expected = "198.51.100.7" if "127.0.0.1" in trusted else "127.0.0.1"
    assert any(line.startswith(f"{expected} GET /healthz 200") for line in lines), lines


# --- TLS on the port itself ---------------------------------------------------------------------------
async def test_tls_serves_the_page_and_a_websocket_turn(engine: Engine, tmp_path: Path) -> None:
    from voicewire.realtime.client import VoicewireClient

    cert = self_signed(tmp_path)
    config = GatewayConfig(tls_cert_file=str(cert.cert), tls_key_file=str(cert.key))
    client_tls = ssl.create_default_context(cafile=str(cert.cert))
    async with served(engine, tls=tls_context(config)) as base:
        assert base.startswith("https://")
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{base}/", ssl=client_tls) as r:
                assert r.status == 200 and "voicewire" in await r.text()
            with pytest.raises(aiohttp.ClientConnectorCertificateError):
                await http.get(f"{base}/healthz")  # the system's trust store does not know this certificate
        async with await VoicewireClient.connect(f"{base}/v1/stream", ssl=client_tls) as client:
            _, audio = await speak_turn(client, "Secure hello.", None)
        assert audio.done.reason == "completed" and len(audio.data) > 24_000
