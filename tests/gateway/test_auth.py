"""Every auth path of the gateway: each refusal has its status and code, and allocates nothing."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

import aiohttp
import pytest
import websockets

from tests.conftest import running_gateway
from tests.realtime.gateway import gateway, wait_gone
from voicewire.engine import Engine
from voicewire.realtime.auth import AuthConfig
from voicewire.realtime.gateway import GATEWAY

pytestmark = pytest.mark.shared_cores  # refusals and their codes: nothing timed

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


async def test_a_token_is_spent_by_a_refused_request(engine: Engine) -> None:
    """Credentials come right after the Origin check: a token presented to a request refused for
    anything else (draining, capacity, media type) is spent, so a token that was seen on a
    refused request (in a proxy's log, say) cannot open a session later."""
    auth = AuthConfig(api_keys=(KEY,))
    async with gateway(engine, auth=auth, max_sessions=1) as gw, aiohttp.ClientSession() as http:
        base = gw.url.removeprefix("http://")
        state = gw.app[GATEWAY]

        async def refused_then_reused(
            refuse: Callable[[str], Awaitable[tuple[int, str]]], expected: tuple[int, str]
        ) -> None:
            _, minted = await _mint(base)
            assert await refuse(minted["token"]) == expected
            bearer = {"Authorization": f"Bearer {minted['token']}"}
            status, body = await _ws_refusal(base, additional_headers=bearer)
            assert (status, body["error"]["code"]) == (401, "token_reused"), expected

        async def offer(token: str, ctype: str = "application/json") -> tuple[int, str]:
            url, headers = f"http://{base}/offer?token={token}", {"Content-Type": ctype}
            async with http.post(url, data="{}", headers=headers) as r:
                return r.status, (await r.json())["error"]["code"]

        async def websocket(token: str) -> tuple[int, str]:
            status, body = await _ws_refusal(base, subprotocols=[f"voicewire.token.{token}"])
            return status, body["error"]["code"]

        await refused_then_reused(lambda t: offer(t, "text/plain"), (415, "unsupported_media_type"))
        state.draining = True
        await refused_then_reused(offer, (503, "draining"))
        state.draining = False
        async with websockets.connect(
            f"ws://{base}/v1/stream", additional_headers={"X-API-Key": KEY}
        ) as held:
            await held.recv()
            await refused_then_reused(websocket, (503, "too_many_sessions"))
        await wait_gone(engine, gw, 5.0)
    # a foreign Origin is refused first, and the token it carried is left as it was
    async with running_gateway(engine, auth=AuthConfig(api_keys=(KEY,), allowed_origins=(ORIGIN,))) as base:
        _, minted = await _mint(base)
        status, body = await _ws_refusal(
            base, origin="http://evil.example.test", subprotocols=[f"voicewire.token.{minted['token']}"]
        )
        assert (status, body["error"]["code"]) == (403, "origin_not_allowed")
        await _ws_ok(f"ws://{base}/v1/stream?token={minted['token']}", origin=ORIGIN)
