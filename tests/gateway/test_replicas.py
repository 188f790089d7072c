"""A gateway in front of two engine-core processes of the embedded voice.

Real core processes (SIGKILL'ed for real), real ZeroMQ sockets, a real aiohttp gateway on
127.0.0.1 and the project's WebSocket client; each test well under a minute on 2 cores.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tests.asr import transcribe, wer
from tests.conftest import free_port
from voicewire.engine import EngineConfig
from voicewire.engine.core import CoreClient, EngineGroup, GroupConfig
from voicewire.realtime.client import VoicewireClient, VoicewireError
from voicewire.realtime.config import GatewayConfig
from voicewire.realtime.gateway import GATEWAY, Gateway
from voicewire.realtime.server import create_app, make_runner

SURVIVOR_TEXT = (
    "The other replica keeps talking while its neighbour is killed, and every word of this "
    "sentence should still reach the listener in one clear piece."
)
LONG = "This turn is long enough to be cut in the middle when its engine core dies. " * 5


@contextlib.asynccontextmanager
async def replica_gateway(engine: EngineConfig, replicas: int = 2) -> AsyncIterator[tuple[str, Gateway]]:
    """The app as ``voicewire serve --replicas N`` builds it: it starts the cores in the background."""
    group = EngineGroup(engine, GroupConfig(replicas=replicas, devices=("cpu",)))
    app = create_app(GatewayConfig(), group=group)
    runner = make_runner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"127.0.0.1:{port}", app[GATEWAY]
    finally:
        await runner.cleanup()


async def _readyz(http: aiohttp.ClientSession, base: str) -> tuple[int, dict[str, Any]]:
    async with http.get(f"http://{base}/readyz") as r:
        return r.status, await r.json()


async def _wait_ready(http: aiohttp.ClientSession, base: str, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status, body = await _readyz(http, base)
        if status == 200:
            return body
        await asyncio.sleep(0.1)
    raise AssertionError(f"/readyz not 200 within {timeout_s} s: {body}")


def _replica_of(gw: Gateway, client: VoicewireClient) -> CoreClient:
    assert client.session is not None
    session = next(s for s in gw.sessions if s.session_id == client.session["session_id"])
    assert isinstance(session.engine, CoreClient)
    return session.engine


async def _say(client: VoicewireClient, text: str, timeout_s: float = 30.0) -> Any:
    turn = await client.start_turn()
    await turn.send(text)
    await turn.end()
    return await turn.collect(timeout_s)


async def _words(text: str, words_per_s: float) -> AsyncIterator[str]:
    words = text.split(" ")
    for i, word in enumerate(words):
        yield word if i == len(words) - 1 else word + " "
        await asyncio.sleep(1.0 / words_per_s)


async def test_not_ready_before_warm_up_then_sessions_spread_over_replicas_and_stick() -> None:
    slow = EngineConfig(model="tests.doubles:slow_warmup", model_options={"warmup_s": 2.0})
    async with replica_gateway(slow) as (base, gw), aiohttp.ClientSession() as http:
        status, body = await _readyz(http, base)
        assert status == 503 and body["status"] == "starting"
        assert [r["state"] for r in body["replicas"]] == ["starting", "starting"]
        async with http.post(f"http://{base}/v1/audio/speech", json={"input": "Too early."}) as r:
            assert r.status == 503 and (await r.json())["error"]["code"] == "not_ready"
        body = await _wait_ready(http, base, 30.0)
        assert [r["state"] for r in body["replicas"]] == ["ready", "ready"]
        assert len({r["pid"] for r in body["replicas"]}) == 2

        first = await VoicewireClient.connect(f"ws://{base}/v1/stream")
        second = await VoicewireClient.connect(f"ws://{base}/v1/stream")
        try:
            here, there = _replica_of(gw, first), _replica_of(gw, second)
            assert here is not there  # equal headroom: the replica with fewer sessions
            opened_before = there.stats.streams_opened
            for i in range(3):
                got = await _say(first, f"Turn number {i + 1} of the same session.")
                assert got.done.reason == "completed" and got.pcm().size > 0
            # Every turn of the first session went to its replica (the counts come with the
            # cores' heartbeats, twice a second).
            deadline = time.monotonic() + 3.0
            while here.stats.streams_opened < 3 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert here.stats.streams_opened == 3 and there.stats.streams_opened == opened_before
        finally:
            await first.close()
            await second.close()


async def test_a_killed_core_ends_only_its_turns_and_comes_back() -> None:
    async with replica_gateway(EngineConfig()) as (base, gw), aiohttp.ClientSession() as http:
        await _wait_ready(http, base, 30.0)
        victim = await VoicewireClient.connect(f"ws://{base}/v1/stream")
        survivor = await VoicewireClient.connect(f"ws://{base}/v1/stream")
        try:
            doomed = _replica_of(gw, victim)
            assert doomed is not _replica_of(gw, survivor)
            steady = survivor.speak(_words(SURVIVOR_TEXT, 20.0))
            surviving = asyncio.create_task(steady.collect(30.0))
            cut = await victim.start_turn()
            await cut.send(LONG)
            await cut.end()
            audio = aiter(cut)
            await anext(audio)  # its audio is flowing: now its core dies
            assert doomed.pid is not None
            os.kill(doomed.pid, signal.SIGKILL)
            with pytest.raises(VoicewireError) as failed:
                async for _ in audio:
                    pass
            assert failed.value.code == "model_error"
            assert cut.result is not None and cut.result.reason == "error"

            status, body = await _readyz(http, base)
            assert status == 503 and body["status"] == "degraded"
            assert body["replicas"][gw.engines.index(doomed)]["state"] in ("down", "starting")
            # While its core is down the session is refused turn by turn, and stays open.
            with pytest.raises(VoicewireError) as refused:
                await _say(victim, "Is anyone there?")
            assert refused.value.code == "not_ready"

            kept = await surviving
            assert kept.done.reason == "completed"
            heard = transcribe(kept.pcm(), survivor.sample_rate_hz)
            assert wer(SURVIVOR_TEXT, heard) <= 0.15, heard

            body = await _wait_ready(http, base, 30.0)
            assert body["replicas"][gw.engines.index(doomed)]["restarts"] == 1
            again = await _say(victim, "Back on the same replica.")
            assert again.done.reason == "completed" and again.pcm().size > 0
            assert _replica_of(gw, victim) is doomed
        finally:
            await victim.close()
            await survivor.close()


def test_serve_with_replicas_starts_its_cores_and_leaves_none_behind() -> None:
    """``voicewire serve --replicas 2`` as a user runs it: ready with two cores; SIGTERM drains,
    stops both cores and exits 0."""
    port = free_port()
    cmd = [sys.executable, "-m", "voicewire.realtime.cli", "serve", "--port", str(port), "--replicas", "2"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        body: dict[str, Any] = {}
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline and body.get("status") != "ready":
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:
                    body = json.loads(r.read())
            except urllib.error.HTTPError as err:
                body = json.loads(err.read())
            except OSError:
                pass
            time.sleep(0.1)
        assert body.get("status") == "ready", body
        pids = [r["pid"] for r in body["replicas"]]
        assert len(set(pids)) == 2 and os.getpid() not in pids
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
