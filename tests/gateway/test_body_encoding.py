"""Request bodies on every POST endpoint: any Content-Encoding is a 415 ``unsupported_encoding``
(never a 500, never inflated), and a body that breaks while it is read is a 400 ``invalid_body``
without a traceback."""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import zlib

import aiohttp
import pytest
import websockets

from tests.conftest import running_gateway
from voicewire.engine import Engine
from voicewire.realtime.auth import AuthConfig

pytestmark = pytest.mark.shared_cores  # codes of broken bodies: nothing timed

KEY = "encoding-key-0123456789"
SPEECH = json.dumps({"input": "Hello."}).encode()
MULTIPART = (
    b'--b\r\nContent-Disposition: form-data; name="name"\r\n\r\nme\r\n'
    b'--b\r\nContent-Disposition: form-data; name="audio"; filename="a.wav"\r\n\r\nRIFF\r\n--b--\r\n'
)
# path -> (Content-Type, a body the endpoint takes unencoded)
ENDPOINTS = {
    "/v1/audio/speech": ("application/json", SPEECH),
    "/offer": ("application/json", json.dumps({"sdp": "v=0\r\n", "type": "offer"}).encode()),
    "/v1/audio/voices": ("multipart/form-data; boundary=b", MULTIPART),
    "/v1/session-tokens": ("application/json", b"{}"),
}


def _encoded(encoding: str, body: bytes) -> bytes:
    """The body as a client would encode it (gzip and deflate for real: a well-formed body is
    refused too, not only a broken one)."""
    if encoding == "gzip":
        return gzip.compress(body)
    if encoding == "deflate":
        return zlib.compress(body)
    return body  # br, zstd, unknown: the refusal never reads the body


async def _code(resp: aiohttp.ClientResponse) -> tuple[int, str]:
    body = await resp.json(content_type=None)
    return resp.status, body["error"]["code"] if resp.status >= 400 else ""


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "br", "zstd", "x-unknown", "gzip, identity"])
async def test_every_post_endpoint_refuses_an_encoded_body(engine: Engine, encoding: str) -> None:
    async with running_gateway(engine) as base, aiohttp.ClientSession(auto_decompress=False) as http:
        for path, (ctype, body) in ENDPOINTS.items():
            headers = {"Content-Type": ctype, "Content-Encoding": encoding}
            async with http.post(f"http://{base}{path}", data=_encoded(encoding, body), headers=headers) as r:
                assert await _code(r) == (415, "unsupported_encoding"), (path, encoding, await r.text())
        # identity is no encoding: the endpoint's own answer; a second header is read too
        headers = {"Content-Type": "application/json", "Content-Encoding": "identity"}
        async with http.post(f"http://{base}/v1/audio/speech", data=SPEECH, headers=headers) as r:
            assert r.status == 200 and len(await r.read()) > 10_000
        two = [
            ("Content-Type", "application/json"),
            ("Content-Encoding", "identity"),
            ("Content-Encoding", encoding),
        ]
        async with http.post(
            f"http://{base}/v1/audio/speech", data=_encoded(encoding, SPEECH), headers=two
        ) as r:
            assert await _code(r) == (415, "unsupported_encoding")


async def test_a_zip_bomb_is_refused_without_being_inflated(engine: Engine) -> None:
    # 50 MB of zeros in ~50 KB: under the body limit, which the inflated body is far over
    bomb = gzip.compress(b"\0" * 50_000_000, compresslevel=9)
    assert len(bomb) < 64 * 1024
    async with running_gateway(engine) as base, aiohttp.ClientSession() as http:
        headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
        async with http.post(f"http://{base}/v1/audio/speech", data=bomb, headers=headers) as r:
            assert await _code(r) == (415, "unsupported_encoding")
        async with http.get(f"http://{base}/healthz") as r:
            assert r.status == 200


async def test_a_refused_encoded_body_spends_its_session_token(engine: Engine) -> None:
    async with (
        running_gateway(engine, auth=AuthConfig(api_keys=(KEY,))) as base,
        aiohttp.ClientSession() as http,
    ):
        async with http.post(f"http://{base}/v1/session-tokens", headers={"X-API-Key": KEY}) as r:
            token = (await r.json())["token"]
        headers = {"Content-Type": "application/json", "Content-Encoding": "br"}
        async with http.post(f"http://{base}/offer?token={token}", data=b"{}", headers=headers) as r:
            assert await _code(r) == (415, "unsupported_encoding")
        with pytest.raises(websockets.InvalidStatus) as err:
            await websockets.connect(f"ws://{base}/v1/stream?token={token}")
        assert json.loads(err.value.response.body)["error"]["code"] == "token_reused"


async def test_a_body_cut_short_is_invalid_body_without_a_traceback(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with running_gateway(engine) as base, aiohttp.ClientSession() as http:
        port = int(base.rsplit(":", 1)[1])
        for path in ("/v1/audio/speech", "/offer"):
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(
                f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                'Content-Length: 1000\r\n\r\n{"in'.encode()
            )
            await writer.drain()
            await asyncio.sleep(0.2)  # the handler is reading the body
            writer.close()  # ...and the client is gone before the rest of it
        deadline = asyncio.get_running_loop().time() + 5
        while asyncio.get_running_loop().time() < deadline:
            async with http.get(f"http://{base}/metrics") as r:
                metrics = await r.text()
            if 'voicewire_errors_total{code="invalid_body"} 2.0' in metrics:
                break
            await asyncio.sleep(0.05)
        assert 'voicewire_errors_total{code="invalid_body"} 2.0' in metrics
    tracebacks = [r.getMessage() for r in caplog.records if r.exc_info]
    assert not tracebacks, tracebacks
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
