"""One /metrics for the gateway processes of a port: each process's real metrics text (GatewayMetrics
as it serves them), merged as peer_metrics.py does; the answer read back with Prometheus' parser.
The processes end to end: tests/gateway/test_serve_workers.py."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

from prometheus_client import Gauge
from prometheus_client.parser import text_string_to_metric_families

from voicewire.engine import Engine, EngineConfig
from voicewire.engine.loop_lag import LoopLag
from voicewire.realtime.metrics import GatewayMetrics
from voicewire.realtime.peer_metrics import render_all, serve_own, socket_path


def _process(engine: Engine, pid: int, turns: int, ttfp_s: float, client_streams: int) -> bytes:
    metrics = GatewayMetrics([engine])
    metrics.watch_process(LoopLag())
    metrics.turns.labels("websocket", "completed").inc(turns)
    metrics.sessions.labels("websocket").inc(turns)
    metrics.ttfp.labels("websocket").observe(ttfp_s)
    Gauge("voicewire_client_streams_max", "", registry=metrics.registry).set(client_streams)
    # each process names itself by its pid: these stand for two
    return metrics.render().replace(f'pid="{os.getpid()}"'.encode(), f'pid="{pid}"'.encode())


def _samples(text: bytes) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for f in text_string_to_metric_families(text.decode())
        for s in f.samples
    }


async def test_one_answer_sums_the_gateways_keeps_each_process_apart_and_the_engine_once(tmp_path: Path) -> None:
    engine = Engine(EngineConfig())
    engine.stats.steps = 7
    first, second = _process(engine, 101, 3, 0.012, 2), _process(engine, 202, 4, 0.3, 5)
    peer = await serve_own(str(tmp_path), lambda: second, pid=202)
    dead = socket_path(str(tmp_path), 303)
    with socket.socket(socket.AF_UNIX) as left:  # a process that ended and left its socket behind
        left.bind(str(dead))
    try:
        merged = _samples(await render_all(str(tmp_path), first))
    finally:
        await peer.cleanup()

    def at(name: str, **labels: str) -> float:
        return merged[(name, frozenset(labels.items()))]

    ws = {"transport": "websocket"}
    assert at("voicewire_gateway_processes") == 2
    assert at("voicewire_turns_total", reason="completed", **ws) == 7
    assert at("voicewire_sessions_active", **ws) == 7
    assert at("voicewire_ttfp_seconds_count", **ws) == 2
    assert at("voicewire_ttfp_seconds_bucket", le="0.015", **ws) == 1  # the histograms' buckets add up
    assert at("voicewire_ttfp_seconds_bucket", le="0.5", **ws) == 2
    assert at("voicewire_client_streams_max") == 5  # the most one client holds: the largest
    assert at("voicewire_engine_steps_total", replica="0") == 7  # the same core behind both: once
    assert {at("voicewire_gateway_process", pid=p) for p in ("101", "202")} == {1.0}
    assert ("process_cpu_seconds_total", frozenset({("pid", "101")})) in merged
    assert ("process_cpu_seconds_total", frozenset({("pid", "202")})) in merged
    assert not dead.exists()  # nothing listened there: gone


async def test_a_peer_that_does_not_answer_is_left_out_in_time(tmp_path: Path) -> None:
    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(30)

    stuck = await asyncio.start_unix_server(hold, path=str(socket_path(str(tmp_path), 404)))
    engine = Engine(EngineConfig())
    try:
        t0 = asyncio.get_running_loop().time()
        merged = _samples(await render_all(str(tmp_path), _process(engine, 101, 1, 0.01, 1)))
        assert asyncio.get_running_loop().time() - t0 < 3.0
    finally:
        stuck.close()
    assert merged[("voicewire_gateway_processes", frozenset())] == 1
    assert merged[("voicewire_turns_total", frozenset({("reason", "completed"), ("transport", "websocket")}))] == 1
