"""A flood of malformed HTTP requests costs a bounded amount of log: each kind, 3,000 times over
raw sockets, adds under 100 KB at INFO (a deployment's level), with no traceback, the server
still answers, and another client's turns beside the flood start on time. aiohttp alone logs each one at ERROR with a traceback: megabytes."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Iterator

import aiohttp
import psutil
import pytest

from tests.conftest import running_gateway
from tests.gateway.victim import victim_alongside
from voicewire.engine import Engine

pytestmark = pytest.mark.shared_cores  # the log's bound under a flood: nothing timed
REQUESTS = 3_000  # of each kind
CONCURRENCY = 32  # connections open at once: a bounded burst on loopback
MAX_LOG_BYTES = 100_000  # per kind
TIMEOUT_S = 10.0  # one connection's exchange

SPEECH = b"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
GZIP = b"Content-Encoding: gzip\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"
MALFORMED: dict[str, bytes] = {
    "duplicate Content-Length": SPEECH + b"Content-Length: 2\r\nContent-Length: 2\r\n\r\n{}",
    "gzip on a body that is not": SPEECH + GZIP,
    "bad chunked body": SPEECH + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
    "garbage request line": b"GET /?token=never-logged HTTP/1.1 and more\r\n\r\n",
    "header too long": b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Long: " + b"a" * 10_000 + b"\r\n\r\n",
}


class _Bytes(logging.Handler):
    """What a deployment's log handler would write: every record's formatted text, traceback included."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
        self.text: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.text.append(self.format(record) + "\n")

    def size(self) -> int:
        return sum(len(t.encode()) for t in self.text)


@pytest.fixture
def server_log() -> Iterator[_Bytes]:
    root = logging.getLogger()
    handler, level = _Bytes(), root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


async def _send(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(reader.read(1024), TIMEOUT_S)
    finally:
        writer.close()


async def _flood(port: int, request: bytes) -> list[bytes]:
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one() -> bytes:
        async with gate:
            return await _send(port, request)

    return await asyncio.gather(*(one() for _ in range(REQUESTS)))


@pytest.mark.parametrize("kind", MALFORMED)
async def test_a_flood_of_malformed_requests_writes_a_bounded_log(
    engine: Engine, server_log: _Bytes, kind: str
) -> None:
    async with running_gateway(engine) as base, aiohttp.ClientSession() as http:
        gc.collect()
        before = psutil.Process().memory_info().rss  # the gateway runs in this process
        async with victim_alongside(base):
            replies = await asyncio.wait_for(_flood(int(base.rsplit(":", 1)[1]), MALFORMED[kind]), 120)
        gc.collect()
        assert psutil.Process().memory_info().rss < 1.1 * before
        assert all(r.startswith((b"HTTP/1.0 4", b"HTTP/1.1 4")) for r in replies), replies[0][:200]
        text = "".join(server_log.text)
        assert server_log.size() < MAX_LOG_BYTES, (server_log.size(), text[:3000])
        assert "Traceback" not in text, text[:3000]
        assert "never-logged" not in text  # the request line's token, which aiohttp's error quotes
        async with http.get(f"http://{base}/healthz") as r:
            assert r.status == 200
