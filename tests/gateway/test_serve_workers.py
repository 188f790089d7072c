"""``voicewire serve --workers N`` as a user runs it: gateway processes on one port in front of one
engine core, a core killed and started again, a model that cannot start, and the flag's bounds.

Real processes (the supervisor, its workers, the core), SO_REUSEPORT, ZeroMQ over TCP on 127.0.0.1
and the project's WebSocket client.
"""

from __future__ import annotations

import argparse
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
from collections.abc import Iterator
from typing import Any

import psutil
import pytest
import websockets
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import free_port, speak_turn
from voicewire.realtime.client import VoicewireClient, VoicewireError
from voicewire.realtime.serve_workers import workers_for

pytestmark = pytest.mark.shared_cores  # processes started, killed and reconnected: nothing timed to the ms
SERVE = [sys.executable, "-m", "voicewire.realtime.cli", "serve"]


def _readyz(port: int) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
            return dict(json.loads(r.read()))
    except urllib.error.HTTPError as err:
        return dict(json.loads(err.read()))


Sample = tuple[str, frozenset[tuple[str, str]]]


def _metrics(port: int) -> dict[Sample, float]:
    """/metrics' samples by name and labels, as Prometheus reads them."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _sample(name: str, **labels: str) -> Sample:
    return name, frozenset(labels.items())


def _wait_ready(port: int, timeout_s: float, restarts: int = 0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    body: dict[str, Any] = {}
    while time.monotonic() < deadline:
        try:
            body = _readyz(port)
        except OSError:
            body = {}
        if body.get("status") == "ready" and body["replicas"][0]["restarts"] >= restarts:
            return body
        time.sleep(0.1)
    raise AssertionError(f"not ready within {timeout_s} s: {body}")


@contextlib.contextmanager
def _serving(*flags: str) -> Iterator[tuple[int, subprocess.Popen[str]]]:
    port = free_port()
    proc = subprocess.Popen(
        [*SERVE, "--port", str(port), "--replicas", "1", *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        _wait_ready(port, 60)
        yield port, proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)


@pytest.fixture
def served() -> Iterator[tuple[int, subprocess.Popen[str]]]:
    with _serving("--workers", "2") as server:
        yield server


async def _turn(port: int, text: str) -> str:
    client = await VoicewireClient.connect(f"http://127.0.0.1:{port}")
    try:
        turn, audio = await speak_turn(client, text, None)
        assert audio.done is not None and audio.done.reason == "completed" and audio.pcm().size > 0
        return str(turn.turn_id)
    finally:
        await client.close()


def test_workers_share_the_port_in_front_of_one_core_and_stop_together(
    served: tuple[int, subprocess.Popen[str]],
) -> None:
    port, proc = served
    tree = psutil.Process(proc.pid).children(recursive=True)
    bodies = [_readyz(port) for _ in range(40)]  # a connection each: the kernel spreads them
    answered = {b["gateway_pid"] for b in bodies}
    assert len(answered) == 2 and answered <= {p.pid for p in tree}, answered
    assert len({b["replicas"][0]["pid"] for b in bodies}) == 1  # one core behind both

    async def turns() -> None:
        await asyncio.gather(*(_turn(port, f"Turn number {i} is spoken.") for i in range(4)))

    asyncio.run(turns())
    for _ in range(6):  # whichever process is asked answers for both
        metrics = _metrics(port)
        assert metrics[_sample("voicewire_gateway_processes")] == 2
        assert metrics[_sample("voicewire_turns_total", reason="completed", transport="websocket")] == 4
        assert {_sample("process_cpu_seconds_total", pid=str(p)) for p in answered} <= metrics.keys()
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert out.count("voicewire: ready") == 2, out
    gone = psutil.wait_procs(tree, timeout=10)[1]
    assert not gone, gone  # no worker, no core left


def test_a_core_that_dies_is_started_again_and_the_workers_reconnect(
    served: tuple[int, subprocess.Popen[str]],
) -> None:
    port, _ = served
    core = _readyz(port)["replicas"][0]["pid"]
    os.kill(core, signal.SIGKILL)
    body = _wait_ready(port, 40, restarts=1)
    assert body["replicas"][0]["pid"] != core
    for _ in range(6):  # whichever worker takes the connection has reconnected
        assert _readyz(port)["status"] == "ready"
    asyncio.run(_turn(port, "Back after the core was started again."))


@pytest.mark.parametrize("workers", [1, 2])
def test_a_core_that_hangs_alive_is_killed_and_started_again(workers: int) -> None:
    """A stopped core keeps its sockets and sends nothing: after --hang-timeout whoever started it
    (the gateway's group in one process, the supervisor with workers) kills it and starts another."""
    with _serving("--workers", str(workers), "--hang-timeout", "3") as (port, _):
        core = psutil.Process(_readyz(port)["replicas"][0]["pid"])
        core.suspend()
        try:
            body = _wait_ready(port, 45, restarts=1)
            assert body["replicas"][0]["pid"] != core.pid
            assert not psutil.wait_procs([core], timeout=10)[1]  # killed, not left stopped
        finally:
            with contextlib.suppress(psutil.NoSuchProcess):
                core.kill()
        asyncio.run(_turn(port, "Back after the core hung."))


def test_a_clients_session_quota_holds_over_every_process() -> None:
    """Its connections reach either process (the kernel hashes each one's port): the quota counts
    them all, and a session given back in one process is one to take in any."""

    async def sessions(port: int) -> None:
        url = f"http://127.0.0.1:{port}"
        held, refused, reached = [], 0, set()
        for _ in range(10):
            reached.add(_readyz(port)["gateway_pid"])
            try:
                held.append(await VoicewireClient.connect(url))
            except VoicewireError as err:
                assert err.code == "quota_exceeded", err
                refused += 1
        assert (len(held), refused, len(reached)) == (2, 8, 2)
        for _ in range(6):  # closed mid-turn, given back before the close completes: the next comes at once
            closing = held.pop()
            await (await closing.start_turn()).send("A reply still speaking when its session closes.")
            await closing.close()
            held.append(await VoicewireClient.connect(url))
        for client in held:
            await client.close()

    with _serving("--workers", "2", "--max-sessions-per-client", "2") as (port, _):
        asyncio.run(sessions(port))


def test_a_model_that_cannot_start_ends_serve_with_its_error_in_one_line() -> None:
    proc = subprocess.run(
        [*SERVE, "--port", str(free_port()), "--replicas", "1", "--workers", "2", "--model", "tests.doubles:no_weights"],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert proc.returncode == 1
    assert "voicewire serve: the model failed to start: " in proc.stderr and "no weights at" in proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr


def test_workers_default_to_the_cores_only_where_the_engine_runs_in_core_processes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def args(**kw: Any) -> argparse.Namespace:
        return argparse.Namespace(**{"workers": None, "ray": None, "cores_file": None, **kw})

    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert workers_for(args(), cores=True) == 4
    assert workers_for(args(), cores=False) == 1  # the engine in the gateway's process
    assert workers_for(args(ray="auto"), cores=True) == 1
    assert workers_for(args(cores_file="/tmp/x"), cores=True) == 1  # a worker itself
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert workers_for(args(), cores=True) == 1
    assert workers_for(args(workers=3), cores=True) == 3
    for bad in ({"workers": 0}, {"workers": 2, "ray": "auto"}):
        with pytest.raises(ValueError):
            workers_for(args(**bad), cores=True)
    with pytest.raises(ValueError):
        workers_for(args(workers=2), cores=False)


def test_workers_without_engine_cores_is_a_usage_error() -> None:
    proc = subprocess.run(
        [*SERVE, "--port", str(free_port()), "--workers", "2"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2 and "--workers needs engine cores" in proc.stderr, proc.stderr


def test_a_session_token_minted_by_one_worker_opens_a_session_on_any_and_only_once() -> None:
    import websockets.sync.client as ws_sync

    key = "workers-key-0123456789abcdef"
    port = free_port()
    proc = subprocess.Popen(
        [*SERVE, "--port", str(port), "--replicas", "1", "--workers", "2", "--api-key", key],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    try:
        _wait_ready(port, 60)

        def mint() -> str:
            req = urllib.request.Request(
                f"http://127.0.0.1:{port}/v1/session-tokens", method="POST", headers={"Authorization": f"Bearer {key}"}
            )
            with urllib.request.urlopen(req, timeout=5) as r:
                return str(json.loads(r.read())["token"])

        def opens(token: str) -> bool:
            try:
                with ws_sync.connect(f"ws://127.0.0.1:{port}/v1/stream?token={token}", open_timeout=5) as ws:
                    return bool(json.loads(ws.recv(timeout=5))["type"] == "session.created")
            except websockets.InvalidStatus as err:
                assert err.response.status_code == 401, err
                return False

        tokens = [mint() for _ in range(8)]  # minted on either worker, redeemed on either
        assert all(opens(t) for t in tokens)
        replays = [opens(tokens[0]) for _ in range(8)]  # whichever worker takes it: spent
        assert not any(replays)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


def test_a_taken_port_ends_serve_before_a_model_has_loaded() -> None:
    """The gateway processes open the port before the cores load their model: a taken port ends
    it all in one line each, without waiting out a warm-up."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        env = {**os.environ, "VOICEWIRE_TEST_WARMUP_S": "120"}
        argv = [*SERVE, "--port", str(taken.getsockname()[1]), "--replicas", "1", "--workers", "2"]
        proc = subprocess.run(
            [*argv, "--model", "tests.doubles:slow_warmup"], env=env, capture_output=True, text=True, timeout=90
        )
    assert proc.returncode == 1 and "cannot listen" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
