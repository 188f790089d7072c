"""One turn of ``voicewire probe`` (``probe.py``) and what a listener got from it: the probe's
settings, a simulated LLM reply driven through a protocol client, and per turn, all times from the
first text sent:

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
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import statistics
import time
from dataclasses import dataclass, field, replace
from typing import Any

from .listener import Arrival, hear, ws_arrivals
from .messages import ReceivedAudio, TurnDone, VoicewireError
from .protocol import ProtocolClient
from .simulated_llm import TEXTS, send_reply
from .websocket import VoicewireClient

TURNS_PER_PROC = 50.0  # open-loop turns a second one client process takes (procs = 0)


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
    # Open loop: client processes sharing the arrivals (each a Poisson of rate / procs); 0: one per
    # TURNS_PER_PROC turns/s. One Python loop reading hundreds of sessions runs out of CPU and
    # stamps arrivals late, which would read as the server's underruns.
    procs: int = 0
    part: tuple[int, int] = (0, 1)  # this process's index among the parts (set by the probe)

    def __post_init__(self) -> None:
        if self.transport not in ("ws", "webrtc"):
            raise ValueError(f"transport must be ws or webrtc, got {self.transport!r}")
        if (
            self.duration_s <= 0
            or self.concurrency < 1
            or (self.max_sessions is not None and self.max_sessions < 1)
        ):
            raise ValueError("duration, concurrency and max sessions must be positive")
        if self.procs < 0 or not 0 <= self.part[0] < self.part[1]:
            raise ValueError("procs must be 0 (one per TURNS_PER_PROC turns/s) or more")
        if self.procs > 1 and self.rate_per_s is None:
            raise ValueError("more than one client process needs an open loop (a rate)")
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
    max_stall_at_s: float | None = None  # when it ended, seconds since the probe started (WebSocket)
    cut_ms: float | None = None  # a barge-in: turn.cancel this far into the listener's playout
    jitter_buffer_ms: float | None = None
    jitter_buffer_max_ms: float | None = None
    rtp_jitter_ms: float | None = None
    server: dict[str, Any] = field(default_factory=dict)


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
    sender = asyncio.create_task(send_reply(turn, text, cfg.tokens_per_s, cfg.first_token_delay_ms / 1000))
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
        cut_ms = rec.cut_ms
        if cut_ms is not None and cutter is not None and cutter.done() and not cutter.cancelled():
            arrivals = _before(
                arrivals, int(cut_ms * client.sample_rate_hz / 1000)
            )  # what was heard before the cut
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
    if heard.max_stall_end_s is not None and heard.max_stall_s * 1000 > rec.max_stall_ms:
        rec.max_stall_ms = round(heard.max_stall_s * 1000, 2)
        rec.max_stall_at_s = round(heard.max_stall_end_s - t_first + rec.t_start_s, 4)
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
