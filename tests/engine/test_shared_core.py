"""A shared engine core (shared_core.py + gateways.py) fronted by several gateways over TCP, as its
Ray actor runs it, without Ray: real core process, real sockets on 127.0.0.1, the embedded voice.

Each gateway gets its own streams' audio straight from the core, a gateway's Shutdown does not stop
what others front, and the streams of a gateway that falls silent are cancelled, their slots freed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator

import numpy as np
import pytest
import pytest_asyncio
import zmq

from voicewire.engine import EngineConfig
from voicewire.engine.core.gateways import GATEWAY_SILENT_S
from voicewire.engine.core.messages import Shutdown, encode_to_core
from voicewire.engine.core.ray_client import RemoteCoreClient
from voicewire.engine.core.shared_core import CoreEndpoint, SharedCore

module_loop = pytest.mark.asyncio(loop_scope="module")
CONFIG = EngineConfig(max_streams=4, max_ahead_s=1.0)
LONG = "This reply goes on for a good while, so that it is still speaking when its gateway goes away. " * 4


@pytest.fixture(scope="module")
def shared() -> Iterator[SharedCore]:
    exits: list[int] = []
    core = SharedCore(CONFIG, "127.0.0.1", "core-test", lambda code, _: exits.append(code))
    core.start()
    assert core.ready.wait(60) and core.failure is None
    yield core
    core.stop()
    assert not exits  # it ran until stopped


def gateway(core: SharedCore, name: str) -> RemoteCoreClient:
    async def locate() -> CoreEndpoint:
        return await asyncio.get_running_loop().run_in_executor(None, core.endpoint, "127.0.0.1", "node")

    return RemoteCoreClient(name, locate)


@pytest_asyncio.fixture(loop_scope="module")
async def two(shared: SharedCore) -> AsyncIterator[tuple[RemoteCoreClient, RemoteCoreClient]]:
    a, b = gateway(shared, "a"), gateway(shared, "b")
    await asyncio.gather(a.start(), b.start())
    yield a, b
    await asyncio.gather(a.close(), b.close())


async def speak(client: RemoteCoreClient, text: str, seed: int) -> np.ndarray:
    stream = client.open_stream(seed=seed)
    stream.push_text(text)
    stream.end()
    return np.concatenate([c.pcm async for c in stream])


@module_loop
async def test_each_gateway_gets_its_own_streams_and_a_gateways_shutdown_stops_nothing(
    shared: SharedCore, two: tuple[RemoteCoreClient, RemoteCoreClient]
) -> None:
    a, b = two
    text = "Hello from one of two gateways."
    pcm_a, pcm_b = await asyncio.gather(speak(a, text, 1), speak(b, text, 1))
    assert pcm_a.size > 12_000 and np.array_equal(pcm_a, pcm_b)  # the same turn, each to its own caller
    ctx = zmq.Context.instance()
    rogue = ctx.socket(zmq.PUSH)
    rogue.setsockopt(zmq.LINGER, 1000)
    rogue.connect(shared.endpoint("127.0.0.1", "node").commands)
    rogue.send_multipart(encode_to_core(Shutdown()))
    rogue.send_multipart([b"not a message"])
    rogue.close()
    await asyncio.sleep(0.5)
    assert (await speak(b, text, 2)).size > 12_000  # the core is still there for everyone


@module_loop
async def test_the_streams_of_a_silent_gateway_are_cancelled(
    shared: SharedCore, two: tuple[RemoteCoreClient, RemoteCoreClient]
) -> None:
    a, b = two
    stream = a.open_stream(seed=3)
    stream.push_text(LONG)  # no end: it speaks and waits for more until cancelled
    async for _ in stream:
        break
    await asyncio.sleep(0.6)  # a Stats beat: b sees a's stream on the core
    assert b.load() >= 1
    a._disconnect()  # killed: no more attaches, no cancel sent
    t0 = time.monotonic()
    while b.load() and time.monotonic() - t0 < GATEWAY_SILENT_S + 5:
        await asyncio.sleep(0.1)
    assert b.load() == 0, "the silent gateway's stream still holds a slot"
    assert time.monotonic() - t0 >= GATEWAY_SILENT_S - 1.5  # not before it was silent for a while
