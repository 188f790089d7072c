"""Shared fixtures: one real engine per test session, a real gateway per test on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

# one source of ports for the tests and their Ray clusters (it never hands out a port twice)
from benchmarks.ray_cluster import free_port as free_port
from voicewire.engine import Engine, EngineConfig

if TYPE_CHECKING:  # the GPU machine runs the engine tests without the transport packages
    from voicewire.realtime.client import ProtocolClient, Turn, TurnAudio, TurnId


# The folders whose tests time audio, sessions and their neighbours over the network: ./scripts/test
# runs them one at a time (-m timed) and the rest two at a time (-m "not timed"), as a busy neighbour
# would make a timed test's figure. A module in them that times nothing says so with
# ``pytestmark = pytest.mark.shared_cores`` and runs beside the others.
TIMED_DIRS = ("gateway", "realtime", "adapters", "deploy", "ray")
TESTS = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        folder = item.path.relative_to(TESTS).parts[0] if item.path.is_relative_to(TESTS) else ""
        if folder in TIMED_DIRS and item.get_closest_marker("shared_cores") is None:
            item.add_marker(pytest.mark.timed)
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


async def speak_turn(
    client: ProtocolClient,
    text: str,
    words_per_s: float | None,
    turn_id: TurnId | None = None,
    timeout_s: float = 30.0,
) -> tuple[Turn, TurnAudio]:
    """One simulated LLM reply (a word per ``text.delta`` at ``words_per_s``, or whole) through the
    client; returns the turn and all it received."""
    turn = await client.start_turn(turn_id)
    reader = asyncio.create_task(turn.collect(timeout_s))
    try:
        from voicewire.realtime.client.simulated_llm import send_reply

        await send_reply(turn, text, words_per_s)
    except BaseException:
        reader.cancel()
        raise
    return turn, await reader
