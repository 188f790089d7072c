"""Faults: abrupt disconnects, a failing stream, SIGTERM drain; and what /metrics and /readyz say."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import aiohttp
import websockets

from tests.asr import transcribe, wer
from tests.conftest import free_port, running_gateway, speak_turn
from voicewire.engine import Engine, EngineConfig
from voicewire.engine.model import GenerateResult
from voicewire.engine.models.hibari_voice import HibariModel
from voicewire.realtime.client import VoicewireClient
from voicewire.realtime.client.simulated_llm import send_reply

LONG = (
    "This turn goes on and on, sentence after sentence, so that it is still playing when the client vanishes. "
    * 4
)


async def _connect(base: str) -> VoicewireClient:
    return await VoicewireClient.connect(f"ws://{base}")


async def test_client_vanishing_mid_turn_frees_its_stream_within_1s(gateway: str, engine: Engine) -> None:
    # A raw socket: the fault is in the transport, below the protocol client.
    ws = await websockets.connect(f"ws://{gateway}/v1/stream", max_size=None)
    await ws.recv()
    await ws.send(json.dumps({"type": "text.delta", "turn_id": 1, "text": LONG}))
    while not isinstance(await ws.recv(), bytes):
        pass
    assert engine.active_streams() == 1
    ws.transport.abort()  # no close frame: the TCP connection just drops
    t0 = time.monotonic()
    while engine.active_streams() and time.monotonic() - t0 < 1.0:
        await asyncio.sleep(0.01)
    assert engine.active_streams() == 0, "the engine stream outlived its client by more than 1 s"


class _FaultyVoice(HibariModel):
    """Fault injection: any clause with the word 'kaboom' raises inside model work."""

    def _generate_one(self, slot: int) -> GenerateResult:
        clauses = self._slots[slot].clauses
        if clauses and "kaboom" in clauses[0]:
            raise RuntimeError("injected fault in model work")
        return super()._generate_one(slot)


async def test_a_stream_failing_in_model_work_leaves_the_others_playing() -> None:
    eng = Engine(EngineConfig(), model=_FaultyVoice()).start()
    texts = [
        "The first caller hears every word of this sentence.",
        "The second caller is also fine, thank you.",
    ]
    try:
        async with running_gateway(eng) as base:
            bad, goods = await _connect(base), [await _connect(base) for _ in texts]
            good_turns = [
                asyncio.create_task(speak_turn(c, t, 25, "g")) for c, t in zip(goods, texts, strict=True)
            ]
            failed, heard = await speak_turn(bad, "Now, kaboom goes the model.", 25, "b")
            assert heard.done.reason == "error"
            assert any(e.code == "model_error" for e in failed.errors)
            for text, (_, res) in zip(texts, await asyncio.gather(*good_turns), strict=True):
                assert res.done.reason == "completed"
                assert wer(text, transcribe(res.pcm(), 24_000)) <= 0.15
            # the failed session is still usable
            _, again = await speak_turn(bad, "All good now.", 25, "again")
            assert again.done.reason == "completed"
            for c in (bad, *goods):
                await c.close()
    finally:
        eng.close()


async def test_metrics_and_readyz(gateway: str) -> None:
    client = await _connect(gateway)
    await speak_turn(client, "Counting this turn.", 30, 1)
    answer = client.expect("error")
    await client.send_raw("{broken")
    await asyncio.wait_for(answer, 5)
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://{gateway}/metrics") as r:
            text = await r.text()
        async with http.get(f"http://{gateway}/readyz") as r:
            assert r.status == 200
    assert 'voicewire_ttfp_seconds_count{transport="websocket"} 1.0' in text
    assert 'voicewire_sessions_active{transport="websocket"} 1.0' in text
    assert 'voicewire_turns_total{reason="completed",transport="websocket"} 1.0' in text
    assert 'voicewire_errors_total{code="invalid_json"} 1.0' in text
    assert "voicewire_engine_streams_active" in text and "voicewire_engine_batches_total" in text
    # the embedded voice's work is all host work: no time waiting for a device
    assert 'voicewire_engine_device_wait_seconds_total{replica="0"} 0.0' in text
    # the turn's open, text and end, handled by the worker between steps
    commands = re.search(r'^voicewire_engine_commands_total\{replica="0"\} (\S+)$', text, re.M)
    seconds = re.search(r'^voicewire_engine_command_seconds_total\{replica="0"\} (\S+)$', text, re.M)
    assert commands and float(commands[1]) >= 3 and seconds and float(seconds[1]) > 0
    # the worker copies the process's collector pauses each step: a turn's allocations run the young
    # generation many times
    collections = re.search(r'^voicewire_engine_gc_collections_total\{replica="0"\} (\S+)$', text, re.M)
    longest = re.search(r'^voicewire_engine_gc_pause_max_seconds\{replica="0"\} (\S+)$', text, re.M)
    assert collections and float(collections[1]) >= 1 and longest and float(longest[1]) > 0
    since_ready = re.search(r'^voicewire_engine_gc_pause_max_since_ready_seconds\{replica="0"\} (\S+)$', text, re.M)
    assert since_ready and 0 < float(since_ready[1]) <= float(longest[1])
    await client.close()


async def test_sigterm_drains_then_exits_0(tmp_path: Path) -> None:
    port = free_port()
    log = (tmp_path / "server.log").open("w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "voicewire.realtime.cli",
            "serve",
            "--port",
            str(port),
            "--drain-timeout",
            "15",
            "--log-format",
            "json",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1)
                break
            except OSError:
                await asyncio.sleep(0.1)
        base = f"127.0.0.1:{port}"
        client = await _connect(base)
        turn = await client.start_turn("last")
        reader = asyncio.create_task(turn.collect(30))
        # A turn whose text is still arriving when SIGTERM comes.
        sender = asyncio.create_task(send_reply(turn, "Please let me finish this sentence before you go.", 10))
        await asyncio.sleep(0.3)
        os.kill(proc.pid, signal.SIGTERM)
        await asyncio.sleep(0.2)
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://{base}/readyz") as r:
                assert r.status == 503
            async with http.get(f"http://{base}/v1/stream") as r:
                assert r.status == 503 and (await r.json())["error"]["code"] == "draining"
        await sender
        assert (await reader).done.reason == "completed"
        try:
            assert proc.wait(timeout=20) == 0
        except subprocess.TimeoutExpired:
            raise AssertionError((tmp_path / "server.log").read_text()[-3000:]) from None
        # structured logs: one JSON object per line, the turn's lines carry its session and turn ids
        lines = [
            json.loads(x) for x in (tmp_path / "server.log").read_text().splitlines() if x.startswith("{")
        ]
        turn_lines = [x for x in lines if x.get("turn_id") == "last"]
        assert turn_lines and all(x["session_id"] and x["transport"] == "websocket" for x in turn_lines)
    finally:
        if proc.poll() is None:
            proc.kill()
