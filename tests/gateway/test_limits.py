"""Each configurable limit, hit, with its documented error code or close code."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest
import websockets

from tests.conftest import running_gateway
from voicewire.engine import Engine
from voicewire.realtime.config import MIN_SESSIONS
from voicewire.realtime.limits import ClientQuotas, SessionLimits


async def _connect(base: str):  # type: ignore[no-untyped-def]
    ws = await websockets.connect(f"ws://{base}/v1/stream", max_size=None)
    assert json.loads(await ws.recv())["type"] == "session.created"
    return ws


async def _next_json(ws) -> dict:  # type: ignore[no-untyped-def,type-arg]
    while True:
        msg = await asyncio.wait_for(ws.recv(), 10)
        if isinstance(msg, str):
            return json.loads(msg)  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("limits", "deltas"),
    [
        (SessionLimits(text_chars_per_s=100, text_burst_chars=200), ["a" * 150, "b" * 150]),
        # 60 one-character deltas are few characters, but many messages
        (SessionLimits(deltas_per_s=1, delta_burst=50), ["ab"[i % 2] for i in range(60)]),
    ],
    ids=["characters", "deltas"],
)
async def test_text_rate_limit(engine: Engine, limits: SessionLimits, deltas: list[str]) -> None:
    async with running_gateway(engine, limits=limits) as base:
        ws = await _connect(base)
        for delta in deltas:
            await ws.send(json.dumps({"type": "text.delta", "turn_id": 1, "text": delta}))
        msg = await _next_json(ws)
        while msg["type"] != "error":
            msg = await _next_json(ws)
        assert msg["code"] == "rate_limited" and msg["turn_id"] == 1
        await ws.send(json.dumps({"type": "turn.cancel", "turn_id": 1}))
        await ws.close()


async def test_queued_turns_limit(engine: Engine) -> None:
    async with running_gateway(engine, limits=SessionLimits(max_open_turns=3)) as base:
        ws = await _connect(base)
        codes = []
        for t in range(6):
            await ws.send(
                json.dumps(
                    {"type": "text.delta", "turn_id": t, "text": "A long turn that keeps playing. " * 3}
                )
            )
        deadline = time.monotonic() + 10
        while "too_many_turns" not in codes and time.monotonic() < deadline:
            msg = await _next_json(ws)
            if msg["type"] == "error":
                codes.append(msg["code"])
        assert "too_many_turns" in codes
        await ws.close()


async def test_sessions_per_process_limit(engine: Engine) -> None:
    async with running_gateway(engine, max_sessions=2) as base:
        a, b = await _connect(base), await _connect(base)
        with pytest.raises(websockets.InvalidStatus) as err:
            await websockets.connect(f"ws://{base}/v1/stream")
        assert err.value.response.status_code == 503
        assert json.loads(err.value.response.body)["error"]["code"] == "too_many_sessions"
        await a.close()
        await asyncio.sleep(0.1)
        c = await _connect(base)  # a slot is free again
        await b.close()
        await c.close()


async def test_the_default_session_limit_follows_the_engines_streams(engine: Engine) -> None:
    # a GPU engine has hundreds of streams: the default limit must let a session reach each one
    streams = engine.stream_limit
    assert streams > MIN_SESSIONS, "the shared engine must have more streams than the floor"
    async with running_gateway(engine, quotas=ClientQuotas(max_sessions=0)) as base:  # one client: all
        sessions = []
        for start in range(0, streams, 32):  # connects in batches: a bounded burst on loopback
            sessions += await asyncio.gather(*(_connect(base) for _ in range(start, min(start + 32, streams))))
        with pytest.raises(websockets.InvalidStatus) as err:
            await websockets.connect(f"ws://{base}/v1/stream")
        assert json.loads(err.value.response.body)["error"]["code"] == "too_many_sessions"
        await asyncio.gather(*(ws.close() for ws in sessions))


async def test_session_lifetime_and_idle_timeout(engine: Engine) -> None:
    async with running_gateway(engine, limits=SessionLimits(max_lifetime_s=1.5)) as base:
        ws = await _connect(base)
        t0 = time.monotonic()
        with pytest.raises(websockets.ConnectionClosed) as closed:
            while True:
                await ws.send(json.dumps({"type": "text.flush", "turn_id": "keepalive"}))  # activity
                await asyncio.sleep(0.2)
                while True:
                    try:
                        await asyncio.wait_for(ws.recv(), 0.01)
                    except TimeoutError:
                        break
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4001
        assert time.monotonic() - t0 < 3.5
    async with running_gateway(engine, limits=SessionLimits(idle_timeout_s=1.0)) as base:
        ws = await _connect(base)
        with pytest.raises(websockets.ConnectionClosed) as closed:
            while True:
                msg = await asyncio.wait_for(ws.recv(), 5)
                assert json.loads(msg)["code"] == "idle_timeout"
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4002


async def test_http_body_limit_is_configurable(engine: Engine) -> None:
    body = json.dumps({"input": "x" * 2000})
    async with (
        running_gateway(engine, max_http_body_bytes=1000) as base,
        aiohttp.ClientSession() as http,
        http.post(f"http://{base}/v1/audio/speech", data=body, headers={"Content-Type": "application/json"}) as r,
    ):
        assert r.status == 413
        assert (await r.json())["error"]["code"] == "body_too_large"


def test_the_default_speech_limit_is_what_the_engine_runs_and_queues(engine: Engine) -> None:
    from voicewire.realtime.config import GatewayConfig
    from voicewire.realtime.gateway import Gateway

    # no fixed cap of the gateway's own: past this the engine itself is full (server_busy)
    engine_takes = engine.stream_limit + engine.config.max_queued_streams
    assert Gateway.create(GatewayConfig(), engine).speech_limit() == engine_takes
    assert Gateway.create(GatewayConfig(max_speech_requests=3), engine).speech_limit() == 3
