"""Every endpoint that can spend engine time goes through one admission: each endpoint x each
refusal, malformed input as 4xx / ``error`` (never a 500 or a silent close), slow clients cut,
idle turns freed, and a second session checked unaffected throughout."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
from typing import Any

import aiohttp
import pytest
import websockets
from yarl import URL

from tests.conftest import running_gateway, wait_engine_idle
from tests.doubles import SlowWarmupModel
from tests.gateway.victim import VICTIM_P95_MS, victim_alongside, victim_ttfp_ms
from voicewire.engine import Engine, EngineConfig
from voicewire.realtime.auth import AuthConfig
from voicewire.realtime.limits import ClientQuotas, SessionLimits

KEY = "admission-key-0123456789"
ORIGIN = "http://app.example.test"
FOREIGN = "https://evil.example"
async def _status(resp: aiohttp.ClientResponse) -> tuple[int, str]:
    body = await resp.json()
    return resp.status, body["error"]["code"] if resp.status >= 400 else ""


async def test_each_endpoint_refuses_each_bad_credential(engine: Engine) -> None:
    auth = AuthConfig(api_keys=(KEY,), allowed_origins=(ORIGIN,))
    speech = json.dumps({"input": "Hello."})
    bad_keys: list[tuple[dict[str, str], int, str]] = [
        ({}, 401, "missing_credentials"),
        ({"X-API-Key": "wrong-key-0123456789"}, 401, "invalid_api_key"),
        ({"Authorization": "Bearer wrong-key-0123456789"}, 401, "invalid_api_key"),
        ({"X-API-Key": "clé-non-ascii-0123456789"}, 401, "invalid_api_key"),  # was a TypeError -> 500
        ({"Authorization": "Bearer clé-non-ascii-0123456789"}, 401, "invalid_api_key"),
        ({"X-API-Key": KEY, "Origin": FOREIGN}, 403, "origin_not_allowed"),
    ]
    json_ct = {"Content-Type": "application/json"}
    async with (
        running_gateway(engine, auth=auth) as base,
        aiohttp.ClientSession() as http,
        victim_alongside(base, api_key=KEY),
    ):
        for headers, status, code in bad_keys:
            async with http.post(
                f"http://{base}/v1/audio/speech", data=speech, headers={**headers, **json_ct}
            ) as r:
                assert await _status(r) == (status, code), ("speech", headers)
            async with http.post(f"http://{base}/offer", data="{}", headers={**headers, **json_ct}) as r:
                assert await _status(r) == (status, code), ("offer", headers)
            async with http.post(f"http://{base}/v1/session-tokens", headers=headers) as r:
                assert await _status(r) == (status, code), ("session-tokens", headers)
            async with http.get(f"http://{base}/metrics", headers=headers) as r:
                assert await _status(r) == (status, code), ("metrics", headers)
            with pytest.raises(websockets.InvalidStatus) as err:
                await websockets.connect(f"ws://{base}/v1/stream", additional_headers=headers)
            refused = err.value.response
            assert (refused.status_code, json.loads(refused.body)["error"]["code"]) == (status, code)
        # a browser page's "simple" cross-site POST: text/plain needs no CORS preflight
        for path in ("/v1/audio/speech", "/offer"):
            async with http.post(
                f"http://{base}{path}", data=speech, headers={"X-API-Key": KEY, "Content-Type": "text/plain"}
            ) as r:
                assert await _status(r) == (415, "unsupported_media_type"), path
        # the right key, and the health endpoints open to anyone
        async with http.post(
            f"http://{base}/v1/audio/speech", data=speech, headers={"X-API-Key": KEY, **json_ct}
        ) as r:
            assert r.status == 200 and len(await r.read()) > 10_000
        async with http.get(f"http://{base}/metrics", headers={"Authorization": f"Bearer {KEY}"}) as r:
            assert r.status == 200 and "voicewire_errors_total" in await r.text()
        for path in ("/healthz", "/readyz"):
            async with http.get(f"http://{base}{path}") as r:
                assert r.status == 200, path
    async with (
        running_gateway(engine, auth=auth, public_metrics=True) as base,
        aiohttp.ClientSession() as http,
        http.get(f"http://{base}/metrics") as r,
    ):
        assert r.status == 200


async def test_malformed_speech_bodies_are_4xx_never_500(engine: Engine) -> None:
    cases: list[tuple[str, int, str]] = [
        (json.dumps({"input": "Hi.", "response_format": []}), 400, "unsupported_format"),
        (json.dumps({"input": "Hi.", "response_format": {"a": 1}}), 400, "unsupported_format"),
        ('{"input": "Hi.", "speed": ' + "9" * 5_000 + "}", 400, "invalid_json"),  # > 4,300 digits
        ('{"input": "Hi.", "speed": ' + "9" * 4_000 + "}", 400, "invalid_speed"),
        ('{"input": ' + "[" * 30_000 + "]" * 30_000 + "}", 400, "invalid_json"),  # deeper than the stack
        ('{"input": "Hi.", "voice": ' + "[" * 500 + "]" * 500 + "}", 400, "invalid_voice"),
        ("\xff\xfe", 400, "invalid_json"),
    ]
    async with running_gateway(engine) as base, aiohttp.ClientSession() as http, victim_alongside(base):
        for body, status, code in cases:
            async with http.post(
                f"http://{base}/v1/audio/speech", data=body, headers={"Content-Type": "application/json"}
            ) as r:
                assert await _status(r) == (status, code), body[:60]


def _raw_http(port: int, parts: list[bytes], pause_s: float = 0.2) -> bytes:
    """Send a request in several TCP writes; return the whole response."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for part in parts:
            s.sendall(part)
            time.sleep(pause_s)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


async def test_body_in_two_writes_is_read_whole_and_a_stalled_body_times_out(engine: Engine) -> None:
    body = json.dumps({"input": "Two writes.", "response_format": "pcm"}).encode()
    head = (
        b"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n"
    )
    async with running_gateway(engine, http_body_timeout_s=1.0) as base:
        port = int(base.rsplit(":", 1)[1])
        reply = await asyncio.to_thread(_raw_http, port, [head + body[:10], body[10:]])
        assert reply.startswith(b"HTTP/1.1 200"), reply[:200]
        assert len(reply) > 10_000
        # the rest of the body never comes: 408, not a handler held forever
        t0 = time.monotonic()
        reply = await asyncio.to_thread(_raw_http, port, [head + body[:10]])
        assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
        assert b"body_timeout" in reply and time.monotonic() - t0 < 5


async def test_slow_headers_connections_are_closed(engine: Engine) -> None:
    """Slowloris: connections that never finish their headers are cut after the header timeout,
    while other clients are served."""
    n = 50
    async with running_gateway(engine, http_keepalive_s=1.0) as base:
        port = int(base.rsplit(":", 1)[1])
        socks = []
        for _ in range(n):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            socks.append(s)
        async with aiohttp.ClientSession() as http, http.get(f"http://{base}/healthz") as r:
            assert r.status == 200
        await asyncio.sleep(3.0)
        closed = 0
        for s in socks:
            s.setblocking(False)
            try:
                closed += s.recv(1) == b""
            except BlockingIOError:
                pass  # still open: nothing to read
            except OSError:
                closed += 1
            s.close()
        assert closed == n, f"{n - closed} of {n} slow-headers connections still open"


async def test_websocket_bad_input_keeps_the_session_open(engine: Engine) -> None:
    bad = [
        '{"type":"text.delta","turn_id":1,"text":' + "9" * 5_000 + "}",  # was a silent close (1000)
        '{"type":"text.delta","turn_id":' + "9" * 5_000 + ',"text":"x"}',
        "[" * 20_000 + "]" * 20_000,
        '{"type":"text.delta","turn_id":9007199254740993,"text":"x"}',
    ]
    async with running_gateway(engine) as base, websockets.connect(f"ws://{base}/v1/stream") as ws:
        await ws.recv()  # session.created
        for raw in bad:
            await ws.send(raw)
            reply = json.loads(await asyncio.wait_for(ws.recv(), 5))
            assert reply["type"] == "error" and reply["code"] in ("invalid_json", "invalid_field"), reply
        await ws.send(json.dumps({"type": "text.delta", "turn_id": "ok", "text": "Still here."}))
        await ws.send(json.dumps({"type": "text.end", "turn_id": "ok"}))
        while True:
            msg = await asyncio.wait_for(ws.recv(), 10)
            if isinstance(msg, str) and json.loads(msg)["type"] == "turn.done":
                assert json.loads(msg)["reason"] == "completed"
                break


async def test_an_error_flood_is_answered_at_a_bounded_rate(engine: Engine) -> None:
    limits = SessionLimits(error_burst=20, errors_per_s=5)
    async with (
        running_gateway(engine, limits=limits) as base,
        websockets.connect(f"ws://{base}/v1/stream") as ws,
    ):
        await ws.recv()
        t0 = time.monotonic()
        for _ in range(1_000):
            await ws.send("{bad")
        await ws.send(json.dumps({"type": "text.delta", "turn_id": "ok", "text": "After the flood."}))
        await ws.send(json.dumps({"type": "text.end", "turn_id": "ok"}))
        errors = 0
        while True:
            msg = await asyncio.wait_for(ws.recv(), 10)
            if isinstance(msg, bytes):
                continue
            data = json.loads(msg)
            errors += data["type"] == "error"
            if data["type"] == "turn.done":
                break
        elapsed_s = time.monotonic() - t0
    assert data["reason"] == "completed"
    assert errors <= 20 + 5 * elapsed_s + 1, (errors, elapsed_s)


async def test_open_turns_without_text_cannot_starve_a_new_session(engine: Engine) -> None:
    """30 sessions each try to hold 9 open turns: each gets its cap, and a new session speaks."""
    async with running_gateway(engine) as base:
        holders = []
        for _ in range(30):
            ws = await websockets.connect(f"ws://{base}/v1/stream")
            await ws.recv()
            for t in range(9):
                await ws.send(json.dumps({"type": "text.delta", "turn_id": t, "text": "Hold "}))
            holders.append(ws)
        await asyncio.sleep(0.5)
        assert engine.active_streams() <= 30 * SessionLimits().max_open_turns
        ttfp_ms = await victim_ttfp_ms(base)
        assert ttfp_ms < VICTIM_P95_MS
        for ws in holders:
            await ws.close()


async def test_an_idle_open_turn_ends_with_timeout_and_frees_its_stream() -> None:
    small = Engine(EngineConfig(model="hibari", max_streams=4)).start()
    try:
        limits = SessionLimits(idle_timeout_s=1.5)
        # the holder and the victim are one client (both 127.0.0.1): no share between them
        async with running_gateway(small, limits=limits, quotas=ClientQuotas(fair_share=False)) as base:
            holder = await websockets.connect(f"ws://{base}/v1/stream")
            await holder.recv()
            for t in range(4):  # every stream of the engine
                await holder.send(json.dumps({"type": "text.delta", "turn_id": t, "text": "Held "}))
            await asyncio.sleep(0.3)
            assert small.active_streams() == 4
            with pytest.raises(Exception, match="server_busy"):
                await victim_ttfp_ms(base)
            reasons: dict[Any, str] = {}
            t0 = time.monotonic()
            while len(reasons) < 4:
                msg = await asyncio.wait_for(holder.recv(), 5)
                if isinstance(msg, str) and json.loads(msg)["type"] == "turn.done":
                    done = json.loads(msg)
                    reasons[done["turn_id"]] = done["reason"]
            assert set(reasons.values()) == {"timeout"}
            assert time.monotonic() - t0 < 4
            await wait_engine_idle(small)  # the streams are free again
            assert await victim_ttfp_ms(base) < VICTIM_P95_MS
            await holder.close()
    finally:
        small.close()


async def test_before_warm_up_health_is_live_and_engine_requests_are_not_ready() -> None:
    """An app given an engine that is still warming up: /healthz 200, /readyz 503, and every
    engine endpoint a clear 503 not_ready; all of them turn ready once it is warm."""
    engine = Engine(EngineConfig(), model=SlowWarmupModel(warmup_s=2.0))
    starter = threading.Thread(target=engine.start)
    starter.start()
    try:
        async with running_gateway(engine) as base, aiohttp.ClientSession() as http:
            async with http.get(f"http://{base}/healthz") as r:
                assert r.status == 200 and (await r.json())["ready"] is False
            async with http.get(f"http://{base}/readyz") as r:
                assert r.status == 503
            async with http.post(f"http://{base}/v1/audio/speech", json={"input": "Hi."}) as r:
                assert await _status(r) == (503, "not_ready")
            async with http.post(f"http://{base}/offer", json={}) as r:
                assert await _status(r) == (503, "not_ready")
            with pytest.raises(websockets.InvalidStatus) as err:
                await websockets.connect(f"ws://{base}/v1/stream")
            assert json.loads(err.value.response.body)["error"]["code"] == "not_ready"
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                async with http.get(f"http://{base}/readyz") as r:
                    if r.status == 200:
                        break
                await asyncio.sleep(0.1)
            assert r.status == 200
            assert await victim_ttfp_ms(base) < VICTIM_P95_MS
    finally:
        starter.join()
        engine.close()


async def test_credentials_never_reach_the_log(engine: Engine, caplog: pytest.LogCaptureFixture) -> None:
    """In any spelling aiohttp reads as a credential (``%74oken`` is ``token``), in any log line:
    the access log, the refusal, and aiohttp's error for a request line it cannot parse (which
    quotes the line)."""
    secret = "s3cret-token-value-0123456789"
    auth = AuthConfig(api_keys=(KEY,))
    spellings = [
        f"token={secret}",
        f"key={secret}",
        f"x=1&api_key={secret}",
        f"%74oken={secret}",  # percent-encoded name: aiohttp decodes it to "token" and reads it
        f"to%6Ben={secret}&x=2",
        f"TOKEN={secret}",
        f"k%65y={secret}",
        f"token={secret[:10]}%2D{secret[11:]}",  # the value percent-encoded: masked all the same
    ]
    with caplog.at_level(logging.INFO):
        async with running_gateway(engine, auth=auth) as base, aiohttp.ClientSession() as http:
            for query in spellings:
                # encoded=True: sent as spelled (yarl would normalize %74 to t)
                async with http.get(URL(f"http://{base}/v1/stream?{query}", encoded=True)) as r:
                    assert r.status == 401, query
            async with http.get(f"http://{base}/healthz", headers={"Authorization": f"Bearer {secret}"}) as r:
                assert r.status == 200
            port = int(base.rsplit(":", 1)[1])
            reply = await asyncio.to_thread(
                _raw_http, port, [f"GET /v1/stream?token={secret} HTTP/1.1 trailing\r\n\r\n".encode()], 0.0
            )
            assert reply.startswith(b"HTTP/1.0 400"), reply[:100]
    lines = [rec.getMessage() + (rec.exc_text or "") for rec in caplog.records]
    access = [rec.getMessage() for rec in caplog.records if rec.name == "aiohttp.access"]
    assert len(access) >= len(spellings) + 1 and sum("token=***" in line for line in access) >= 4, access
    assert not any(secret in line or secret[:10] in line for line in lines), lines
