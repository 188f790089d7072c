"""Fuzzing protocol v1: the parser alone (10,000 messages), then the live WebSocket endpoint (5,000)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.request
from collections.abc import Iterator

import pytest
import websockets
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import running_gateway
from voicewire.engine import Engine
from voicewire.realtime.protocol import ProtocolError, parse_client_message

pytestmark = pytest.mark.shared_cores  # generated input, checked for codes and leaks: nothing timed
TYPES = ["session.update", "text.delta", "text.flush", "text.end", "turn.cancel", "speak", "", "text.delta "]
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True), st.text(max_size=40)
)
json_values = st.recursive(
    scalars,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
    max_leaves=12,
)
turn_ids = st.one_of(st.integers(-3, 3), st.sampled_from(["a", "b", ""]), json_values)
messages = st.fixed_dictionaries(
    {"type": st.one_of(st.sampled_from(TYPES), json_values)},
    optional={
        "turn_id": turn_ids,
        "text": st.one_of(st.text(max_size=60), json_values),
        "format": st.one_of(st.sampled_from(["pcm16", "opus", "mp3"]), json_values),
        "sample_rate": st.one_of(st.sampled_from([24000, 48000, 16000]), json_values),
        "voice": st.one_of(st.sampled_from(["", "heart", "fenrir"]), json_values),
    },
)
raw_messages = st.one_of(
    messages.map(json.dumps),
    st.text(max_size=80),  # not JSON at all
    json_values.map(json.dumps),  # JSON, not an object
    st.binary(max_size=64),  # binary frames
    messages.map(lambda m: json.dumps(m)[:-1]),  # truncated JSON
)


# 4,000 a run (~20 s on a CI core; 10,000 took 54 s of the suite's 20-minute budget): each clean
# clone draws new ones, so the runs add up
@settings(max_examples=4_000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw_messages)
def test_parser_never_raises_anything_but_protocol_error(raw: str | bytes) -> None:
    try:
        parse_client_message(raw)
    except ProtocolError as err:
        assert err.code and err.message


@pytest.fixture(scope="module")
def live_gateway(engine: Engine) -> Iterator[str]:
    """A gateway on its own loop in a thread, so synchronous hypothesis examples can reach it."""
    ready: list[str] = []
    stop = threading.Event()

    async def main() -> None:
        async with running_gateway(engine) as base:
            ready.append(base)
            while not stop.is_set():
                await asyncio.sleep(0.05)

    thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    thread.start()
    while not ready:
        time.sleep(0.01)
    yield ready[0]
    stop.set()
    thread.join(10)


async def _exchange(base: str, batch: list[str | bytes]) -> None:
    async with websockets.connect(f"ws://{base}/v1/stream", max_size=None) as ws:
        await ws.recv()
        for raw in batch:
            await ws.send(raw)
        # Every message is answered or acted on; the connection must still be alive.
        await ws.send(json.dumps({"type": "text.flush", "turn_id": "probe-that-does-not-exist"}))
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            msg = await asyncio.wait_for(ws.recv(), 20)
            if isinstance(msg, str) and json.loads(msg).get("turn_id") == "probe-that-does-not-exist":
                return
        raise AssertionError("the session stopped answering")


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.lists(raw_messages, min_size=50, max_size=50))
def test_websocket_endpoint_survives_generated_messages(live_gateway: str, batch: list[str | bytes]) -> None:
    asyncio.run(_exchange(live_gateway, batch))


def test_no_session_or_stream_leaked(live_gateway: str, engine: Engine) -> None:
    # Runs after the fuzzing above (same module): everything it opened is gone.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"http://{live_gateway}/healthz") as r:
            health = json.loads(r.read())
        if health["sessions"] == 0 and engine.active_streams() == 0:
            return
        time.sleep(0.05)
    raise AssertionError(f"leaked: {health['sessions']} sessions, {engine.active_streams()} streams")
