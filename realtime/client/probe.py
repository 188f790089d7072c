"""``voicewire probe``: drive a running server with simulated LLM turns and measure what a listener gets.

    voicewire probe --url http://127.0.0.1:8080 --duration 30 --concurrency 4 --out probe.json --plot probe.png
    voicewire probe --transport webrtc --rate 2 --first-token-ms 300 --tokens-per-s 40

Each turn is one simulated LLM reply: after ``--first-token-ms`` (the LLM's own time to first
token, not ours) its words come at ``--tokens-per-s`` (a token is a word here), or the whole reply
at once (``--whole``), then ``text.end``. Turns run closed loop (``--concurrency`` sessions, each
speaking turns back to back, ``--gap-s`` apart) or open loop (``--rate`` Poisson arrivals per
second, each on an idle session of a pool that grows as the arrivals need, up to
``--max-sessions``; or on a session of its own with ``--session-per-turn``). What each turn
measures (TTFB, TTFA, end to end, underruns, barge-ins): ``probe_turn.py``.

It prints percentiles under a progress bar, and writes JSON and a PNG (latency distribution and
latency over time): ``probe_report.py``; the command line: ``probe_cli.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import random
import sys
import time
from dataclasses import replace
from typing import Any, TextIO

import numpy as np

from voicewire.engine import heap
from voicewire.engine.loop_lag import LoopLag

from .messages import VoicewireError
from .probe_report import DONE, ProbePart, report
from .probe_turn import TURNS_PER_PROC, ProbeConfig, TurnRecord, run_turn
from .protocol import ProtocolClient
from .websocket import VoicewireClient

PROGRESS_INTERVAL_S = 0.5  # redraw on a terminal
PROGRESS_LOG_INTERVAL_S = 5.0  # a new line in a log file
PROCS_UP_S = 60.0  # a client process's start (its imports) at most


class Probe:
    def __init__(self, cfg: ProbeConfig, out: TextIO | None = sys.stderr) -> None:
        self.cfg = cfg
        self.records: list[TurnRecord] = []
        self.sessions_opened = 0
        self._connects = 0  # connects begun, for the round robin over source addresses
        self.connect_ms: list[float] = []
        self._out = out
        self._rng = random.Random(cfg.seed)
        self._t0 = 0.0
        self._clients: list[ProtocolClient] = []
        self._receiver_stats: list[dict[str, float]] = []
        self._server: dict[str, Any] = {}
        self._lag = LoopLag()  # the probe's own loop: an arrival it stamps late is no server's stall
        self._cpu_s = self._wall_s = 0.0
        self._start_at: float | None = None  # time.time() at which the open loop begins

    async def connect(self) -> ProtocolClient:
        t = time.perf_counter()
        client: ProtocolClient
        if self.cfg.transport == "ws":
            options: dict[str, Any] = {}
            if self.cfg.clients > 1:
                # this process's share of the addresses (every procs-th from its index), round robin
                index, procs = self.cfg.part
                mine = range(index % self.cfg.clients, self.cfg.clients, procs)
                options["local_addr"] = (f"127.0.0.{1 + mine[self._connects % len(mine)]}", 0)
                self._connects += 1  # before the await: connects run side by side
            client = await VoicewireClient.connect(self.cfg.url, api_key=self.cfg.api_key, **options)
        else:
            from .webrtc import WebRtcClient

            client = await WebRtcClient.connect(self.cfg.url, api_key=self.cfg.api_key)
        self.connect_ms.append(round((time.perf_counter() - t) * 1000, 2))
        self.sessions_opened += 1
        self._clients.append(client)
        return client

    def _global(self, i: int) -> int:
        """A session's or arrival's number among every process's (this one's ``i``-th)."""
        index, procs = self.cfg.part
        return i * procs + index

    def _text(self) -> str:
        return self._rng.choice(self.cfg.texts)

    async def _turn(
        self, client: ProtocolClient, session: int, n: int, text: str | None = None
    ) -> TurnRecord:
        text = text if text is not None else self._text()
        g = self._global
        rec = TurnRecord(g(session), g(n), round(time.perf_counter() - self._t0, 3), len(text.split()))
        if self.cfg.barge_in and self._rng.random() < self.cfg.barge_in:
            rec.cut_ms = round(self._rng.uniform(*self.cfg.barge_in_after_s) * 1000, 1)
        self.records.append(rec)
        return await run_turn(client, text, self.cfg, rec, self._t0)

    async def _closed_loop_session(self, session: int) -> None:
        client = await self.connect()
        n = 0
        while time.perf_counter() - self._t0 < self.cfg.duration_s:
            rec = await self._turn(client, session, n)
            n += 1
            if rec.reason in ("failed", "timeout") and client.closed:
                client = await self.connect()
            # Like a conversation: the next turn comes once the listener has heard this one (a
            # WebSocket delivers a turn several times faster than it plays).
            heard_s = self._t0 + rec.t_start_s + (rec.e2e_ms or 0.0) / 1000
            await asyncio.sleep(max(0.0, heard_s - time.perf_counter()) + self.cfg.gap_s)

    async def _open_loop(self) -> None:
        cfg = self.cfg
        assert cfg.rate_per_s is not None
        idle: list[tuple[int, ProtocolClient]] = []
        opened = 0  # sessions opened or opening (connects run inside the arrivals' tasks)
        if not cfg.session_per_turn:
            # Enough sessions for the expected overlap (a turn lasts ~3-5 s), opened before the clock.
            for _ in range(min(cfg.max_sessions or 1 << 30, max(1, math.ceil(cfg.rate_per_s * 5)))):
                idle.append((opened, await self.connect()))
                opened += 1
        if self._start_at is not None:  # the other processes' arrivals begin at the same moment
            await asyncio.sleep(max(0.0, self._start_at - time.time()))
        self._t0 = time.perf_counter()
        tasks: set[asyncio.Task[None]] = set()
        n = 0

        async def one(k: int, t_arrival_s: float, text: str) -> None:
            nonlocal opened
            if idle and not cfg.session_per_turn:
                session, client = idle.pop()
            elif cfg.max_sessions is not None and opened >= cfg.max_sessions:
                self.records.append(TurnRecord(-1, self._global(k), t_arrival_s, 0, "refused", "no free session"))
                return
            else:
                session, opened = opened, opened + 1
                try:
                    client = await self.connect()
                except (VoicewireError, OSError, TimeoutError) as err:
                    g = self._global
                    self.records.append(TurnRecord(g(session), g(k), t_arrival_s, 0, "refused", f"connect: {err}"))
                    return
            rec = await self._turn(client, session, k, text)
            if cfg.session_per_turn:
                await self._retire(client)
            elif not (rec.reason in ("failed", "timeout") and client.closed):
                idle.append((session, client))

        t_next = self._t0
        while True:
            t_next += self._rng.expovariate(cfg.rate_per_s)
            if t_next - self._t0 >= cfg.duration_s:
                break
            await asyncio.sleep(max(0.0, t_next - time.perf_counter()))
            task = asyncio.create_task(one(n, round(t_next - self._t0, 3), self._text()))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            n += 1
        if tasks:
            await asyncio.gather(*tasks)

    async def _retire(self, client: ProtocolClient) -> None:
        """Close a session now, keeping its receiver figures (WebRTC) for the summary."""
        self._clients.remove(client)
        with contextlib.suppress(Exception):
            stats = getattr(client, "receiver_stats", None)  # WebRTC only
            if stats is not None:
                self._receiver_stats.append(await stats())
            await client.close()

    async def run(self, start_at: float | None = None) -> None:
        """``start_at``: the open loop's first moment (``time.time()``), for processes that share it."""
        self._start_at = start_at
        if self.cfg.part == (0, 1):
            self._server = await _server_info(self.cfg.url)
        progress = asyncio.create_task(self._progress())
        heap.PAUSES.install()
        heap.freeze()  # the probe's own start-up heap out of its collections: they stop every arrival's clock
        self._lag.start()
        cpu0, wall0 = time.process_time(), time.perf_counter()
        try:
            if self.cfg.rate_per_s is not None:
                await self._open_loop()
            else:
                self._t0 = time.perf_counter()
                await asyncio.gather(*(self._closed_loop_session(i) for i in range(self.cfg.concurrency)))
        finally:
            progress.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await progress
            self._draw_progress(final=True)
            for client in list(self._clients):
                await self._retire(client)
            self._lag.stop()
            heap.release()
            self._cpu_s, self._wall_s = time.process_time() - cpu0, time.perf_counter() - wall0

    async def _progress(self) -> None:
        tty = self._out is not None and self._out.isatty()
        while True:
            await asyncio.sleep(PROGRESS_INTERVAL_S if tty else PROGRESS_LOG_INTERVAL_S)
            self._draw_progress()

    def _draw_progress(self, final: bool = False) -> None:
        if self._out is None or not self._t0:
            return
        elapsed = min(time.perf_counter() - self._t0, self.cfg.duration_s)
        width = 30
        filled = int(width * elapsed / self.cfg.duration_s)
        ttfa = [r.ttfa_ms for r in self.records if r.ttfa_ms is not None]
        p50 = f"{np.percentile(ttfa, 50):.0f} ms" if ttfa else "-"
        bad = sum(1 for r in self.records if r.reason in ("failed", "timeout", "refused", "error"))
        line = (
            f"[{'#' * filled}{'.' * (width - filled)}] {elapsed:5.1f}/{self.cfg.duration_s:g} s  "
            f"turns {len(self.records)}  p50 ttfa {p50}  errors {bad}"
        )
        tty = self._out.isatty()
        self._out.write(("\r" if tty else "") + line + ("\n" if final or not tty else ""))
        self._out.flush()

    # --- results ---------------------------------------------------------------------------------------
    def part(self) -> ProbePart:
        done = [r for r in self.records if r.reason in DONE]
        return ProbePart(self.records, self.sessions_opened, self.connect_ms, self._receiver_stats, self._own(done))

    def result(self) -> dict[str, Any]:
        return report(self.cfg, self._server, [self.part()])

    def _own(self, done: list[TurnRecord]) -> dict[str, Any]:
        """What the probe's own process did: its CPU, its loop's stalls and collections, and the
        turns whose longest stall overlapped one of those (their arrivals were stamped late here)."""
        lag, t0 = self._lag, self._t0

        def held(r: TurnRecord) -> bool:
            if not r.underruns or r.max_stall_at_s is None:
                return False
            t_end = t0 + r.max_stall_at_s
            return bool(lag.between(t_end - r.max_stall_ms / 1000, t_end))

        pauses = heap.PAUSES.between(t0, t0 + self._wall_s)
        return {
            "cpu_s": round(self._cpu_s, 2),
            "wall_s": round(self._wall_s, 2),
            "loop_lag_max_ms": round(lag.max_s * 1000, 2),
            "loop_stalls": lag.stalls,
            "gc_pause_max_ms": round(max((p.seconds for p in pauses), default=0.0) * 1000, 2),
            "underran_while_held": sum(1 for r in done if held(r)),
        }


async def _server_info(url: str) -> dict[str, Any]:
    """The server's ``/healthz`` (model, sample rate), for the record; {} if it has none."""
    import aiohttp

    base = url if "://" in url else "http://" + url
    base = base.replace("ws://", "http://").replace("wss://", "https://").split("/v1/")[0].rstrip("/")
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2.0)) as http,
            http.get(f"{base}/healthz") as resp,
        ):
            info = await resp.json(content_type=None)
            return info if isinstance(info, dict) else {}
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return {}


def procs_for(cfg: ProbeConfig) -> int:
    """Client processes for ``cfg``: its ``procs``, else one per TURNS_PER_PROC turns/s of an open
    loop (at most a process per core)."""
    if cfg.procs or cfg.rate_per_s is None:
        return max(1, cfg.procs)
    return max(1, min(math.ceil(cfg.rate_per_s / TURNS_PER_PROC), os.cpu_count() or 1))


async def probe(cfg: ProbeConfig, out: TextIO | None = sys.stderr) -> dict[str, Any]:
    """Run the probe; returns the JSON-ready result."""
    procs = procs_for(cfg)
    if procs == 1:
        p = Probe(cfg, out)
        await p.run()
        return p.result()
    return await _probe_in_processes(cfg, procs, out)


async def _probe_in_processes(cfg: ProbeConfig, procs: int, out: TextIO | None) -> dict[str, Any]:
    """The open loop from ``procs`` processes (spawned: the parent runs a loop), each a Poisson of
    ``rate / procs`` with a seed of its own, started at one moment once every one is up."""
    import multiprocessing

    server = await _server_info(cfg.url)
    ctx = multiprocessing.get_context("spawn")
    up, go, start_at, parts = ctx.Barrier(procs + 1), ctx.Event(), ctx.Value("d", 0.0), ctx.Queue()
    assert cfg.rate_per_s is not None
    shares = [
        replace(
            cfg,
            rate_per_s=cfg.rate_per_s / procs,
            max_sessions=None if cfg.max_sessions is None else math.ceil(cfg.max_sessions / procs),
            seed=cfg.seed * procs + k,
            part=(k, procs),
        )
        for k in range(procs)
    ]
    children = [
        ctx.Process(target=_run_part, args=(share, up, go, start_at, parts), daemon=True) for share in shares
    ]
    for child in children:
        child.start()
    loop = asyncio.get_running_loop()
    try:
        await loop.run_in_executor(None, up.wait, PROCS_UP_S)
        start_at.value = time.time() + 0.1
        go.set()
        if out is not None:
            print(f"voicewire probe: {procs} client processes, {cfg.duration_s:g} s", file=out, flush=True)
        wait_s = cfg.duration_s + cfg.turn_timeout_s + PROCS_UP_S
        got = [await loop.run_in_executor(None, parts.get, True, wait_s) for _ in children]
    finally:
        for child in children:
            await loop.run_in_executor(None, child.join, 5.0)
            if child.is_alive():
                child.kill()
    return report(cfg, server, got)


def _run_part(cfg: ProbeConfig, up: Any, go: Any, start_at: Any, parts: Any) -> None:
    """A client process of ``_probe_in_processes``: up, then its share of the open loop."""
    up.wait(PROCS_UP_S)
    go.wait(PROCS_UP_S)
    p = Probe(cfg, out=None)
    asyncio.run(p.run(start_at=start_at.value))
    parts.put(p.part())
