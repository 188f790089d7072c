"""Every auth path of the gateway: each refusal has its status and code, and allocates nothing."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
import websockets

from tests.conftest import running_gateway
from voicewire.engine import Engine
from voicewire.realtime.auth import AuthConfig

KEY = "test-key-0123456789abcdef"
ORIGIN = "http://app.example.test"


async def _mint(base: str, key: str | None = KEY) -> tuple[int, dict]:  # type: ignore[type-arg]
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"http://{base}/v1/session-tokens", headers=headers) as r,
    ):
        return r.status, await r.json()


async def _ws_refusal(base: str, **kwargs: object) -> tuple[int, dict]:  # type: ignore[type-arg]
    with pytest.raises(websockets.InvalidStatus) as err:
        await websockets.connect(f"ws://{base}/v1/stream", **kwargs)  # type: ignore[arg-type]
    resp = err.value.response
    return resp.status_code, json.loads(resp.body or b"{}")


async def _ws_ok(url: str, **kwargs: object) -> None:
    ws = await websockets.connect(url, **kwargs)  # type: ignore[arg-type]
    created = json.loads(await ws.recv())
    assert created["type"] == "session.created"
    await ws.close()


def _nothing_allocated(engine: Engine, app_sessions: int) -> None:
    assert engine.active_streams() == 0 and app_sessions == 0


async def _sessions(base: str) -> int:
    async with aiohttp.ClientSession() as http, http.get(f"http://{base}/healthz") as r:
        return int((await r.json())["sessions"])


async def test_every_auth_path(engine: Engine) -> None:
    auth = AuthConfig(api_keys=(KEY,), allowed_origins=(ORIGIN,), token_ttl_s=1.0)
    async with running_gateway(engine, auth=auth) as base:
        # no credentials
        status, body = await _ws_refusal(base)
        assert (status, body["error"]["code"]) == (401, "missing_credentials")
        # wrong API key (header) and a garbage token
        status, body = await _ws_refusal(base, additional_headers={"X-API-Key": "wrong-key-0123456789"})
        assert (status, body["error"]["code"]) == (401, "invalid_api_key")
        with pytest.raises(websockets.InvalidStatus) as err:
            await websockets.connect(f"ws://{base}/v1/stream?token=abc.def")
        assert err.value.response.status_code == 401
        assert json.loads(err.value.response.body)["error"]["code"] == "invalid_token"
        # minting needs the key
        status, body = await _mint(base, key=None)
        assert (status, body["error"]["code"]) == (401, "missing_credentials")
        status, body = await _mint(base, key="nope-nope-nope-nope")
        assert (status, body["error"]["code"]) == (401, "invalid_api_key")
        # a token works once: as a query parameter...
        status, body = await _mint(base)
        assert status == 200 and body["ttl_s"] <= 300
        token = body["token"]
        await _ws_ok(f"ws://{base}/v1/stream?token={token}", origin=ORIGIN)
        # ...and is refused the second time
        with pytest.raises(websockets.InvalidStatus) as err:
            await websockets.connect(f"ws://{base}/v1/stream?token={token}", origin=ORIGIN)
        assert json.loads(err.value.response.body)["error"]["code"] == "token_reused"
        # as a subprotocol (what a browser can send)
        _, body = await _mint(base)
        await _ws_ok(
            f"ws://{base}/v1/stream", subprotocols=[f"voicewire.token.{body['token']}"], origin=ORIGIN
        )
        # expired
        _, body = await _mint(base)
        await asyncio.sleep(1.2)
        with pytest.raises(websockets.InvalidStatus) as err:
            await websockets.connect(f"ws://{base}/v1/stream?token={body['token']}", origin=ORIGIN)
        assert json.loads(err.value.response.body)["error"]["code"] == "expired_token"
        # wrong origin, even with a valid token
        _, body = await _mint(base)
        with pytest.raises(websockets.InvalidStatus) as err:
            await websockets.connect(
                f"ws://{base}/v1/stream?token={body['token']}", origin="http://evil.example.test"
            )
        assert err.value.response.status_code == 403
        assert json.loads(err.value.response.body)["error"]["code"] == "origin_not_allowed"
        # WebRTC signalling passes the same admission: refused before the offer is even read
        async with aiohttp.ClientSession() as http:
            async with http.post(f"http://{base}/offer", json={"sdp": "v=0", "type": "offer"}) as r:
                assert (r.status, (await r.json())["error"]["code"]) == (401, "missing_credentials")
            async with http.post(
                f"http://{base}/offer",
                json={"sdp": "v=0", "type": "offer"},
                headers={"Origin": "http://evil.example.test"},
            ) as r:
                assert (r.status, (await r.json())["error"]["code"]) == (403, "origin_not_allowed")
            _, minted = await _mint(base)
            async with http.post(
                f"http://{base}/offer?token={minted['token']}",
                json={"sdp": "v=0", "type": "offer"},
                headers={"Origin": ORIGIN},
            ) as r:
                assert r.status == 400  # admitted; then the (bad) SDP itself is refused
        # the API key itself opens a session (server to server, no Origin)
        await _ws_ok(f"ws://{base}/v1/stream", additional_headers={"Authorization": f"Bearer {KEY}"})
        await asyncio.sleep(0.1)
        _nothing_allocated(engine, await _sessions(base))
        # refusals are counted by code (metrics need the key when auth is on)
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://{base}/metrics", headers={"X-API-Key": KEY}) as r,
        ):
            text = await r.text()
        for code in (
            "missing_credentials",
            "invalid_api_key",
            "invalid_token",
            "token_reused",
            "expired_token",
            "origin_not_allowed",
        ):
            assert f'voicewire_errors_total{{code="{code}"}}' in text


async def test_auth_is_off_by_default(gateway: str) -> None:
    await _ws_ok(f"ws://{gateway}/v1/stream", origin="http://anything.example.test")
