"""Engine cores as Ray actors on two nodes, gateways in front, as docs/across-hosts.md runs them.

One cluster for the module (conftest.py): a head and a second node with distinct custom resources,
one core of the embedded voice pinned to each by ``voicewire engine --resources``, a gateway of
two workers on one port (the page's command) and a second gateway on another. The tests run in
order on it: placement and readiness, routing by the cores' reported load from both gateways, a
core's actor killed mid-turn, a gateway restarted, the second node lost, the cores stopped.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.asr import transcribe, wer
from voicewire.realtime.client import Turn, VoicewireClient, VoicewireError

from .conftest import BIN, Stack, doc_commands, ray

pytestmark = [pytest.mark.ray, pytest.mark.slow]

SURVIVOR_TEXT = (
    "The other core keeps talking while its neighbour is killed, and every word of this "
    "sentence should still reach the listener in one clear piece. Nothing that happens on the "
    "other node may cut it short or make it stutter."
)
LONG = "This turn is long enough to be cut in the middle when its engine core dies. " * 5
HELD = "This turn stays open while the next session picks its core."
STEADY_READS = 4  # the cores report their load twice a second; 4 reads 0.2 s apart see it everywhere


def readyz(port: int) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


async def until(check: Any, timeout_s: float, what: str) -> Any:
    """Poll ``check()`` (off the loop) until it returns something truthy."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = await asyncio.to_thread(check)
        except OSError as err:  # a gateway not listening yet
            last = err
        if last and not isinstance(last, OSError):
            return last
        await asyncio.sleep(0.2)
    raise AssertionError(f"{what} within {timeout_s} s: {last}")


def cores(port: int) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in readyz(port)[1].get("replicas", [])}


def ready_cores(port: int, n: int = 2) -> dict[str, dict[str, Any]] | None:
    status, body = readyz(port)
    rows = {r["name"]: r for r in body.get("replicas", [])}
    return rows if status == 200 and sum(r["state"] == "ready" for r in rows.values()) >= n else None


def busy(port: int) -> dict[str, int]:
    return {name: r["core_streams"] for name, r in cores(port).items()}


async def connect(port: int) -> VoicewireClient:
    return await VoicewireClient.connect(f"ws://127.0.0.1:{port}/v1/stream")


async def hold_turn(port: int) -> tuple[VoicewireClient, Turn]:
    """A session whose turn stays open (text sent, no end): its stream holds a slot on its core."""
    client = await connect(port)
    turn = await client.start_turn()
    await turn.send(HELD)
    return client, turn


async def settle(port: int, expected: dict[str, int]) -> None:
    seen: list[dict[str, int]] = []

    def check() -> bool:
        # the same on several reads: behind --workers each read may be another process's view
        seen.append(busy(port))
        return len(seen) >= STEADY_READS and all(v == expected for v in seen[-STEADY_READS:])

    await until(check, 10.0, f"core loads {expected} (seen {seen[-3:]})")


async def finish(client: VoicewireClient, turn: Turn) -> None:
    await turn.end()
    got = await turn.collect(30.0)
    assert got.done.reason == "completed" and got.pcm().size > 0
    await client.close()


async def words(text: str, words_per_s: float) -> AsyncIterator[str]:
    parts = text.split(" ")
    for i, word in enumerate(parts):
        yield word if i == len(parts) - 1 else word + " "
        await asyncio.sleep(1.0 / words_per_s)


async def say(client: VoicewireClient, text: str) -> Any:
    turn = await client.start_turn()
    await turn.send(text)
    await turn.end()
    return await turn.collect(30.0)


async def test_the_pages_commands_place_one_core_on_each_node(stack: Stack) -> None:
    assert [c[:2] for c in stack.ran] == [
        ["ray", "get-auth-token"], ["ray", "start"], ["export", "RAY_AUTH_MODE=token"], ["ray", "start"],
        ["voicewire", "engine"], ["voicewire", "engine"], ["voicewire", "gateway"],
    ]  # fmt: skip
    a = await until(lambda: ready_cores(stack.gateway_a), 60.0, "gateway A ready with two cores")
    b = await until(lambda: ready_cores(stack.gateway_b), 60.0, "gateway B ready with two cores")
    assert sorted(a) == sorted(b) == ["core-0", "core-1"]
    assert a["core-0"]["node_id"] != a["core-1"]["node_id"]
    by_resource = {
        name: next(n["NodeID"] for n in ray.nodes() if n["Alive"] and resource in n["Resources"])
        for name, resource in (("core-0", "head_node"), ("core-1", "node2"))
    }
    assert {name: a[name]["node_id"] for name in a} == by_resource
    # Two workers behind gateway A's one port (SO_REUSEPORT): new connections reach both.
    pids = {readyz(stack.gateway_a)[1]["gateway_pid"] for _ in range(40)}
    assert len(pids) == 2, pids
    health = urllib.request.urlopen(f"http://127.0.0.1:{stack.gateway_a}/healthz", timeout=2)
    assert health.status == 200


async def test_new_sessions_go_to_the_core_with_the_most_free_streams_from_either_gateway(stack: Stack) -> None:
    a, b = stack.gateway_a, stack.gateway_b
    await settle(a, {"core-0": 0, "core-1": 0})
    first = await hold_turn(a)  # equal loads: either core
    x = await until(lambda: next((n for n, k in busy(b).items() if k == 1), None), 10.0, "the first turn's stream")
    y = "core-1" if x == "core-0" else "core-0"
    await settle(a, {x: 1, y: 0})
    second = await hold_turn(b)  # B sees x loaded (as the core reports it): the other core
    await settle(b, {x: 1, y: 1})
    await finish(*first)
    await settle(b, {x: 0, y: 1})
    third = await hold_turn(b)  # B again, now y is the loaded one: B has reached both cores
    await settle(b, {x: 1, y: 1})
    await finish(*second)
    await settle(a, {x: 1, y: 0})
    fourth = await hold_turn(a)  # A reaches y too
    await settle(a, {x: 1, y: 1})
    await finish(*third)
    await finish(*fourth)
    counts = {n: r["streams_opened"] for n, r in cores(a).items()}
    assert counts[x] >= 2 and counts[y] >= 2, counts


async def test_a_core_killed_mid_turn_fails_only_its_turn_and_comes_back(stack: Stack) -> None:
    a, b = stack.gateway_a, stack.gateway_b
    await settle(a, {"core-0": 0, "core-1": 0})
    survivor_client, survivor_turn = await hold_turn(b)
    survivor_core = await until(
        lambda: next((n for n, k in busy(b).items() if k == 1), None), 10.0, "the survivor's stream"
    )
    doomed_core = "core-1" if survivor_core == "core-0" else "core-0"
    await settle(a, {survivor_core: 1, doomed_core: 0})
    restarts = cores(a)[doomed_core]["restarts"]
    steady = asyncio.create_task(_speak_on(survivor_turn))  # words at 20/s through gateway B
    victim = await connect(a)  # a new session on A: the core the survivor does not load
    try:
        cut = await victim.start_turn()
        await cut.send(LONG)
        await cut.end()
        audio = aiter(cut)
        await anext(audio)  # its audio flows: now Ray kills its core's actor (and restarts it)
        ray.kill(ray.get_actor(doomed_core, namespace="voicewire"), no_restart=False)
        with pytest.raises(VoicewireError) as failed:
            async for _ in audio:
                pass
        assert failed.value.code == "model_error"
        kept = await steady
        assert kept.done.reason == "completed"
        heard = transcribe(kept.pcm(), survivor_client.sample_rate_hz)
        assert wer(f"{HELD} {SURVIVOR_TEXT}", heard) <= 0.15, heard

        back = await until(
            lambda: (c := cores(a)[doomed_core])["state"] == "ready" and c["restarts"] > restarts and c,
            60.0,
            f"{doomed_core} restarted by Ray and reconnected",
        )
        assert back["restarts"] == restarts + 1
        again = await say(victim, "Back on the same core after its restart.")  # the session sticks to it
        assert again.done.reason == "completed" and again.pcm().size > 0
        await until(lambda: cores(a)[doomed_core]["streams_opened"] >= 1 or None, 5.0, "the restarted core's turn")
    finally:
        await victim.close()
        await survivor_client.close()


async def _speak_on(turn: Turn) -> Any:
    async for word in words(" " + SURVIVOR_TEXT, 20.0):
        await turn.send(word)
    await turn.end()
    return await turn.collect(30.0)


async def test_a_gateway_restart_loses_no_core(stack: Stack) -> None:
    b = stack.gateway_b
    before = await until(lambda: ready_cores(b), 60.0, "gateway B ready")
    assert stack.stop_gateway(b) == 0  # SIGTERM: it drains and exits
    stack.start_gateway(b)
    after = await until(lambda: ready_cores(b), 60.0, "the restarted gateway B ready")
    # the same core processes, none restarted: the gateway's going touched none of them
    assert {n: r["pid"] for n, r in after.items()} == {n: r["pid"] for n, r in before.items()}
    client = await connect(b)
    try:
        got = await say(client, "The cores were there all along.")
        assert got.done.reason == "completed" and got.pcm().size > 0
    finally:
        await client.close()


async def test_losing_the_second_node_leaves_the_head_core_serving(stack: Stack) -> None:
    a = stack.gateway_a
    await until(lambda: ready_cores(a), 60.0, "gateway A ready with both cores")
    # The node's host is gone: its raylet, and every process under it (its workers, their cores).
    for proc in stack.node2_tree():
        proc.kill()
    await until(lambda: cores(a)["core-1"]["state"] != "ready", 15.0, "core-1 seen down")
    status, body = readyz(a)
    assert status == 200 and {r["name"]: r["state"] for r in body["replicas"]}["core-0"] == "ready"
    clients = [await connect(a) for _ in range(3)]
    try:
        for client in clients:
            got = await say(client, "Still serving from the head node.")
            assert got.done.reason == "completed" and got.pcm().size > 0
    finally:
        for client in clients:
            await client.close()


async def test_the_pages_stop_command_removes_the_cores(stack: Stack) -> None:
    stop = next(c for c in doc_commands() if c.startswith("voicewire engine") and "--stop" in c)
    argv = [str(BIN / "voicewire"), *stop.split()[1:]]
    out = await asyncio.to_thread(subprocess.run, argv, env=stack.env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "core-0" in out.stdout, out.stdout + out.stderr
    await until(lambda: readyz(stack.gateway_a)[0] == 503 or None, 15.0, "gateway A not ready without cores")
    for port in list(stack.gateways):
        assert stack.stop_gateway(port, signal.SIGTERM) == 0
