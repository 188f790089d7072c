"""Shared fixtures: one real engine per test session, a real gateway per test on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from voicewire.engine import Engine, EngineConfig


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the lent H200)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def engine() -> Iterator[Engine]:
    eng = Engine(EngineConfig(model="hibari")).start()
    yield eng
    eng.close()


@contextlib.asynccontextmanager
async def running_gateway(engine: Engine, **config: Any) -> AsyncIterator[str]:
    """A real aiohttp gateway on 127.0.0.1 (free port) around ``engine``; yields "127.0.0.1:PORT"."""
    from tests.realtime.gateway import gateway

    async with gateway(engine, **config) as gw:
        yield gw.url.removeprefix("http://")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def wait_engine_idle(engine: Engine, timeout_s: float = 2.0) -> None:
    """Until the engine holds no stream; fails after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while engine.active_streams() and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert engine.active_streams() == 0, f"engine still holds {engine.active_streams()} streams"


@pytest.fixture
async def gateway(engine: Engine) -> AsyncIterator[str]:
    async with running_gateway(engine) as base:
        yield base


@dataclass
class TurnResult:
    turn_id: Any
    audio: bytearray = field(default_factory=bytearray)
    audio_times: list[float] = field(default_factory=list)  # perf_counter per binary message
    audio_sizes: list[int] = field(default_factory=list)  # bytes per binary message
    messages: list[dict[str, Any]] = field(default_factory=list)
    done: dict[str, Any] | None = None
    t_first_sent: float = 0.0
    t_last_sent: float = 0.0

    def pcm(self) -> np.ndarray:
        return np.frombuffer(bytes(self.audio), "<i2").astype(np.float32) / 32768.0


async def read_turn(ws: Any, result: TurnResult, timeout_s: float = 30.0) -> TurnResult:
    """Collect binary audio and JSON until turn.done for ``result.turn_id``."""
    deadline = time.monotonic() + timeout_s
    while True:
        msg = await asyncio.wait_for(ws.recv(), timeout=max(0.1, deadline - time.monotonic()))
        if isinstance(msg, bytes):
            result.audio += msg
            result.audio_times.append(time.perf_counter())
            result.audio_sizes.append(len(msg))
            continue
        data = json.loads(msg)
        result.messages.append(data)
        if data.get("type") == "turn.done" and data.get("turn_id") == result.turn_id:
            result.done = data
            return result


async def send_words(ws: Any, turn_id: Any, text: str, words_per_s: float, result: TurnResult | None = None) -> None:
    """A simulated LLM: one word (with its trailing space) per delta at ``words_per_s``."""
    words = text.split(" ")
    for i, w in enumerate(words):
        delta = w if i == len(words) - 1 else w + " "
        await ws.send(json.dumps({"type": "text.delta", "turn_id": turn_id, "text": delta}))
        now = time.perf_counter()
        if result is not None:
            result.t_first_sent = result.t_first_sent or now
            result.t_last_sent = now
        await asyncio.sleep(1.0 / words_per_s)
    await ws.send(json.dumps({"type": "text.end", "turn_id": turn_id}))
