"""``voicewire probe``: drive a running server with simulated LLM turns and measure what a listener gets.

    voicewire probe --url http://127.0.0.1:8080 --duration 30 --concurrency 4 --out probe.json --plot probe.png
    voicewire probe --transport webrtc --rate 2 --first-token-ms 300 --tokens-per-s 40

Each turn is one simulated LLM reply: after ``--first-token-ms`` (the LLM's own time to first
token, not ours) its words come at ``--tokens-per-s`` (a token is a word here), or the whole reply
at once (``--whole``), then ``text.end``. Turns run closed loop (``--concurrency`` sessions, each
speaking turns back to back, ``--gap-s`` apart) or open loop (``--rate`` Poisson arrivals per
second, each on an idle session of a pool that grows as the arrivals need, up to
``--max-sessions``; or on a session of its own with ``--session-per-turn``). Per turn, all times
from the first text sent:

- ``ttfb_ms``: the first audio byte (WebSocket) or the first packet with any sound (WebRTC: the
  server sends digital silence between turns);
- ``ttfa_ms``: the first audible sample (the first 10 ms window above the engine's onset level),
  as played by a listener who starts playing at the first byte: arrival of the audio that holds
  it, plus its place in that audio (``listener.py``);
- ``e2e_ms``: the end of that listener's playout of the turn's last sample;
- ``underruns``: stalls of a listener who starts ``--buffer-ms`` after the first byte and then
  plays in real time (WebRTC: also silence the server's pacer inserted, see ``_measure_webrtc``);
- WebRTC only: ``jitter_buffer_ms``, the mean time from a packet's arrival to aiortc's receive path
  handing its frame out (aiortc holds 4 packets, ~80 ms), and ``rtp_jitter_ms``, the receiver's
  RFC 3550 interarrival jitter (aiortc's inbound-rtp stats);
- ``cut_ms``: with ``--barge-in SHARE``, that share of turns is cut by ``turn.cancel`` a uniform
  ``--barge-in-after`` into the listener's playout (its underruns count up to the cut);
- ``server``: the turn's own ``turn.done`` figures (``ttfp_ms``, ``ttfa_ms``, ``played_ms``, ...).

It prints percentiles under a progress bar, and writes JSON and a PNG (latency distribution and
latency over time): ``probe_report.py``; the command line: ``probe_cli.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import platform
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, TextIO

import numpy as np

from .listener import Arrival, hear, ws_arrivals
from .messages import ReceivedAudio, TurnDone, VoicewireError
from .probe_report import summarize
from .protocol import ProtocolClient
from .simulated_llm import TEXTS, send_reply
from .websocket import VoicewireClient

PROGRESS_INTERVAL_S = 0.5  # redraw on a terminal
PROGRESS_LOG_INTERVAL_S = 5.0  # a new line in a log file


@dataclass(frozen=True)
class ProbeConfig:
    url: str = "http://127.0.0.1:8080"
    transport: str = "ws"  # "ws" | "webrtc"
    duration_s: float = 30.0  # no turn starts after this; turns in flight finish
    concurrency: int = 1  # closed loop: sessions, each speaking turns back to back
    rate_per_s: float | None = None  # open loop: Poisson turn arrivals per second (concurrency unused)
    gap_s: float = 0.2  # closed loop: pause between two turns of a session
    first_token_delay_ms: float = 0.0  # the simulated LLM's time to first token
    tokens_per_s: float | None = 30.0  # None: the whole reply in one text.delta
    # A browser's WebRTC jitter buffer holds at least ~40 ms; ws_bench's zero-buffer convention
    # would count every packet 1 ms late as a stall.
    buffer_ms: float = 40.0
    # Open loop: sessions are opened as arrivals need them, up to this many (then an arrival counts
    # as refused); None: no cap.
    max_sessions: int | None = None
    session_per_turn: bool = False  # open loop: each arrival opens its own session, closed after the turn
    turn_timeout_s: float = 60.0
    texts: tuple[str, ...] = TEXTS
    seed: int = 0
    api_key: str | None = field(default=None, repr=False)  # never written to the JSON
    # WebSocket sessions come from this many loopback addresses (127.0.0.1, .2, ...), round robin:
    # the server's per-client quotas see that many clients, as real traffic is many users. 1: one.
    clients: int = 1
    barge_in: float = 0.0  # the share of turns a listener cuts with turn.cancel, as a user barging in
    barge_in_after_s: tuple[float, float] = (0.3, 1.5)  # how far into its playout, uniform

    def __post_init__(self) -> None:
        if self.transport not in ("ws", "webrtc"):
            raise ValueError(f"transport must be ws or webrtc, got {self.transport!r}")
        if self.duration_s <= 0 or self.concurrency < 1 or (self.max_sessions is not None and self.max_sessions < 1):
            raise ValueError("duration, concurrency and max sessions must be positive")
        if not 1 <= self.clients <= 254:
            raise ValueError("clients must be within 1..254 (loopback addresses 127.0.0.1-254)")
        if self.clients > 1 and self.transport != "ws":
            raise ValueError("clients > 1 spreads WebSocket sessions over loopback addresses: ws only")
        if self.rate_per_s is not None and self.rate_per_s <= 0:
            raise ValueError("rate must be positive")
        if self.tokens_per_s is not None and self.tokens_per_s <= 0:
            raise ValueError("tokens per second must be positive")
        if not self.texts:
            raise ValueError("texts must not be empty")
        if not 0.0 <= self.barge_in <= 1.0 or not 0.0 < self.barge_in_after_s[0] <= self.barge_in_after_s[1]:
            raise ValueError("barge-in must be a share within 0..1, after a positive range of seconds")

    def describe(self) -> str:
        load = (
            f"Poisson {self.rate_per_s:g} turns/s"
            if self.rate_per_s is not None
            else f"concurrency {self.concurrency}"
        )
        text = f"{self.tokens_per_s:g} tokens/s" if self.tokens_per_s is not None else "whole replies"
        cut = (
            f", {self.barge_in:.0%} cut {self.barge_in_after_s[0]:g}-{self.barge_in_after_s[1]:g} s in"
            if self.barge_in
            else ""
        )
        return (
            f"{self.transport} {self.url}, {load}, {self.duration_s:g} s, {text} after "
            f"{self.first_token_delay_ms:g} ms, client buffer {self.buffer_ms:g} ms{cut}"
        )


@dataclass
class TurnRecord:
    session: int
    turn: int
    t_start_s: float  # first text sent, seconds since the probe started
    words: int
    reason: str = ""  # turn.done's reason, or "timeout" / "refused" / "failed"
    error: str = ""
    ttfb_ms: float | None = None
    ttfa_ms: float | None = None
    e2e_ms: float | None = None
    done_ms: float | None = None  # first text sent -> turn.done received
    audio_ms: float = 0.0  # audio received (WebRTC: from the first to the last packet with sound)
    underruns: int = 0
    stall_ms: float = 0.0
    max_stall_ms: float = 0.0  # the longest single stall
    cut_ms: float | None = None  # a barge-in: turn.cancel this far into the listener's playout
    jitter_buffer_ms: float | None = None
    jitter_buffer_max_ms: float | None = None
    rtp_jitter_ms: float | None = None
    server: dict[str, Any] = field(default_factory=dict)


# --- one turn ----------------------------------------------------------------------------------------
async def run_turn(
    client: ProtocolClient, text: str, cfg: ProbeConfig, rec: TurnRecord, t0_probe: float
) -> TurnRecord:
    """One turn; ``rec.cut_ms`` set: the listener barges in that far into its playout."""
    turn = await client.start_turn()
    chunks: list[ReceivedAudio] = []
    heard = asyncio.Event()

    async def read() -> None:
        async for c in turn.audio():
            chunks.append(c)
            heard.set()

    async def barge_in(cut_s: float) -> None:
        await heard.wait()
        await asyncio.sleep(cfg.buffer_ms / 1000 + cut_s)  # playout starts a buffer after the first byte
        sender.cancel()  # the agent stops its LLM's reply and tells the server what was heard
        await turn.send_cancel(played_ms=cut_s * 1000)

    reader = asyncio.create_task(read())
    sender = asyncio.create_task(
        send_reply(turn, text, cfg.tokens_per_s, cfg.first_token_delay_ms / 1000)
    )
    cutter = asyncio.create_task(barge_in(rec.cut_ms / 1000)) if rec.cut_ms is not None else None
    done: TurnDone | None = None
    try:
        await asyncio.wait({sender})  # a barge-in may cancel it
        if not sender.cancelled():
            sender.result()
        done = await turn.done(cfg.turn_timeout_s)
        if cutter is not None and heard.is_set():
            # a reply sent in full before the cut: the server truncates its account there instead
            await asyncio.wait_for(cutter, cfg.turn_timeout_s)
            done = await turn.played(cfg.turn_timeout_s)
        await reader
    except TimeoutError:
        rec.reason = "timeout"
        with contextlib.suppress(Exception):
            await turn.cancel(timeout_s=2.0)
    except VoicewireError as err:
        rec.reason, rec.error = ("refused" if not turn.started else "failed"), str(err)
    finally:
        for task in (sender, reader, cutter):
            if task is not None:
                task.cancel()
    t_done = time.perf_counter()
    t_first = turn.t_first_text_s
    if t_first is None:
        return rec
    rec.t_start_s = round(t_first - t0_probe, 3)
    if done is not None:
        rec.reason = done.reason
        rec.done_ms = round((t_done - t_first) * 1000, 2)
        rec.server = {"audio_ms": done.audio_ms, "played_ms": done.played_ms, **done.metrics}
    if isinstance(client, VoicewireClient):
        arrivals = ws_arrivals(chunks)
        if cutter is not None and cutter.done() and not cutter.cancelled():  # what was heard before the cut
            arrivals = _before(arrivals, int(rec.cut_ms * client.sample_rate_hz / 1000))
        _measure(rec, arrivals, client.sample_rate_hz, t_first, cfg)
    else:
        await _measure_webrtc(rec, client, t_first, t_done, cfg)
    return rec


def _before(arrivals: list[Arrival], samples: int) -> list[Arrival]:
    """The turn's arrivals cut at its ``samples``-th sample: what a listener who stopped there heard."""
    out: list[Arrival] = []
    start = 0
    for a in arrivals:
        if start >= samples:
            break
        n = min(a.samples, samples - start)
        onset = a.onset_sample if a.onset_sample is not None and a.onset_sample < n else None
        out.append(replace(a, samples=n, onset_sample=onset))
        start += n
    return out


def _measure(rec: TurnRecord, arrivals: list[Arrival], rate: int, t_first: float, cfg: ProbeConfig) -> None:
    heard = hear(arrivals, rate, t_first, cfg.buffer_ms / 1000)
    if heard is None:
        return
    rec.ttfb_ms = round(heard.ttfb_s * 1000, 2)
    if heard.ttfa_s is not None:
        rec.ttfa_ms = round(heard.ttfa_s * 1000, 2)
    rec.e2e_ms = round(heard.e2e_s * 1000, 2)
    rec.underruns += heard.underruns
    rec.stall_ms = round(rec.stall_ms + heard.stall_s * 1000, 2)
    rec.max_stall_ms = round(max(rec.max_stall_ms, heard.max_stall_s * 1000), 2)
    rec.audio_ms = round(heard.audio_s * 1000, 1)


async def _measure_webrtc(
    rec: TurnRecord, client: ProtocolClient, t_first: float, t_done: float, cfg: ProbeConfig
) -> None:
    from .webrtc import SAMPLE_RATE_HZ, SOUND_DBFS, WebRtcClient

    assert isinstance(client, WebRtcClient)
    # turn.done comes once the last frame left the server's pacer: allow a few ms of transport.
    packets = client.packets_between(t_first, t_done + 0.05)
    sound = [i for i, p in enumerate(packets) if p.level_dbfs > SOUND_DBFS]
    if sound:
        turn_packets = packets[sound[0] : sound[-1] + 1]
        # The server's pacer fills a dry queue (an engine underrun) with digital silence, which
        # the wire cannot tell from the voice's own digital-zero pauses (up to ~80 ms inside the
        # embedded voice's clause pauses). So it shows as the turn spanning more packets than the
        # server paced out (its last frame zero-padded), plus one: the Opus decoder's 6.5 ms delay
        # can spill the last frame's sound into the first silence packet.
        paced_frames = math.ceil(float(rec.server.get("played_ms", 0.0)) / 20.0 - 1e-6)
        inserted_frames = len(turn_packets) - paced_frames - 1
        if paced_frames and inserted_frames > 0:
            rec.underruns += 1
            rec.stall_ms += inserted_frames * 20.0
            rec.max_stall_ms = max(rec.max_stall_ms, inserted_frames * 20.0)
        arrivals = [Arrival(p.t_arrival_s, p.samples, p.onset_sample) for p in turn_packets]
        _measure(rec, arrivals, SAMPLE_RATE_HZ, t_first, cfg)
        delays = client.jitter_buffer_delays_s(turn_packets)
        if delays:
            rec.jitter_buffer_ms = round(statistics.fmean(delays) * 1000, 2)
            rec.jitter_buffer_max_ms = round(max(delays) * 1000, 2)
    stats = await client.receiver_stats()
    if "jitter_ms" in stats:
        rec.rtp_jitter_ms = round(stats["jitter_ms"], 2)


# --- load --------------------------------------------------------------------------------------------
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

    async def connect(self) -> ProtocolClient:
        t = time.perf_counter()
        client: ProtocolClient
        if self.cfg.transport == "ws":
            options: dict[str, Any] = {}
            if self.cfg.clients > 1:
                options["local_addr"] = (f"127.0.0.{1 + self._connects % self.cfg.clients}", 0)
                self._connects += 1  # before the await: connects run side by side
            client = await VoicewireClient.connect(self.cfg.url, api_key=self.cfg.api_key, **options)
        else:
            from .webrtc import WebRtcClient

            client = await WebRtcClient.connect(self.cfg.url, api_key=self.cfg.api_key)
        self.connect_ms.append(round((time.perf_counter() - t) * 1000, 2))
        self.sessions_opened += 1
        self._clients.append(client)
        return client

    def _text(self) -> str:
        return self._rng.choice(self.cfg.texts)

    async def _turn(self, client: ProtocolClient, session: int, n: int, text: str | None = None) -> TurnRecord:
        text = text if text is not None else self._text()
        rec = TurnRecord(session, n, round(time.perf_counter() - self._t0, 3), len(text.split()))
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
        self._t0 = time.perf_counter()
        tasks: set[asyncio.Task[None]] = set()
        n = 0

        async def one(k: int, t_arrival_s: float, text: str) -> None:
            nonlocal opened
            if idle and not cfg.session_per_turn:
                session, client = idle.pop()
            elif cfg.max_sessions is not None and opened >= cfg.max_sessions:
                self.records.append(TurnRecord(-1, k, t_arrival_s, 0, "refused", "no free session"))
                return
            else:
                session, opened = opened, opened + 1
                try:
                    client = await self.connect()
                except (VoicewireError, OSError, TimeoutError) as err:
                    self.records.append(TurnRecord(session, k, t_arrival_s, 0, "refused", f"connect: {err}"))
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

    async def run(self) -> None:
        self._server = await _server_info(self.cfg.url)
        progress = asyncio.create_task(self._progress())
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
    def result(self) -> dict[str, Any]:
        done = [r for r in self.records if r.reason in ("completed", "cancelled", "length")]  # audio played

        def vals(get: Any) -> list[float]:
            return [v for v in (get(r) for r in done) if v is not None]

        summary: dict[str, Any] = {
            "turns": len(self.records),
            "completed": sum(1 for r in self.records if r.reason == "completed"),
            "cancelled": sum(1 for r in self.records if r.reason == "cancelled"),
            "cut": sum(1 for r in done if r.cut_ms is not None),
            "errors": {
                k: sum(1 for r in self.records if r.reason == k)
                for k in ("error", "failed", "timeout", "refused")
            },
            "sessions": self.sessions_opened,
            "audio_s": round(sum(r.audio_ms for r in done) / 1000, 2),
            "underruns": sum(r.underruns for r in done),
            "turns_with_underruns": sum(1 for r in done if r.underruns),
            "connect_ms": summarize(self.connect_ms),
            "ttfb_ms": summarize(vals(lambda r: r.ttfb_ms)),
            "ttfa_ms": summarize(vals(lambda r: r.ttfa_ms)),
            "e2e_ms": summarize(vals(lambda r: r.e2e_ms)),
            "server_ttfp_ms": summarize(vals(lambda r: r.server.get("ttfp_ms"))),
            "server_ttfa_ms": summarize(vals(lambda r: r.server.get("ttfa_ms"))),
        }
        if self.cfg.transport == "webrtc":
            summary["jitter_buffer_ms"] = summarize(vals(lambda r: r.jitter_buffer_ms))
            summary["rtp_jitter_ms"] = summarize(vals(lambda r: r.rtp_jitter_ms))
            summary["packets_received"] = int(sum(s.get("packets_received", 0) for s in self._receiver_stats))
            summary["packets_lost"] = int(sum(s.get("packets_lost", 0) for s in self._receiver_stats))
        return {
            "probe": {
                "description": self.cfg.describe(),
                "config": {k: v for k, v in asdict(self.cfg).items() if k != "api_key"},
                "started_utc": datetime.now(UTC).isoformat(timespec="seconds"),
                "client": f"{platform.node()} python {platform.python_version()}",
                "server": self._server,
            },
            "summary": summary,
            "turns": [asdict(r) for r in self.records],
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


async def probe(cfg: ProbeConfig, out: TextIO | None = sys.stderr) -> dict[str, Any]:
    """Run the probe; returns the JSON-ready result."""
    p = Probe(cfg, out)
    await p.run()
    return p.result()


