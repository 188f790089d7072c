"""``voicewire probe`` against a live local server, and its playout model."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import running_gateway
from voicewire.engine import Engine
from voicewire.realtime.client import ReceivedAudio
from voicewire.realtime.client.listener import Arrival, audible_time_s, playout, ws_arrivals
from voicewire.realtime.client.probe import ProbeConfig, probe

RATE_HZ = 24_000


def test_playout_counts_stalls_against_the_buffer() -> None:
    # Three 100 ms pieces; the third arrives 150 ms after the first instead of by 200 ms... and
    # the second 130 ms late.
    arrivals = [Arrival(0.0, 2400), Arrival(0.230, 2400), Arrival(0.250, 2400)]
    p = playout(arrivals, RATE_HZ, 0.0)
    assert p.underruns == 1 and p.stall_s == pytest.approx(0.130)
    assert p.starts_s == pytest.approx([0.0, 0.230, 0.330])
    assert p.end_s == pytest.approx(0.430)
    assert p.max_stall_s == pytest.approx(0.130) and p.max_stall_end_s == pytest.approx(0.230)
    buffered = playout(arrivals, RATE_HZ, 0.150)  # a 150 ms buffer absorbs it
    assert buffered.underruns == 0 and buffered.stall_s == 0.0


def test_audible_time_is_the_onset_as_played_from_the_first_byte() -> None:
    quiet = np.zeros(1200, "<i2")  # 50 ms of silence, then a tone
    tone = (3000 * np.sin(np.arange(2400) * 0.2)).astype("<i2")
    chunks = [
        ReceivedAudio(quiet.tobytes(), "pcm16", RATE_HZ, 1.000),
        ReceivedAudio(tone.tobytes(), "pcm16", RATE_HZ, 1.010),  # arrives before it is due
    ]
    arrivals = ws_arrivals(chunks)
    assert arrivals[0].onset_sample is None and arrivals[1].onset_sample == 0
    assert audible_time_s(arrivals, RATE_HZ) == pytest.approx(1.050)
    late = ws_arrivals([chunks[0], ReceivedAudio(tone.tobytes(), "pcm16", RATE_HZ, 1.200)])
    assert audible_time_s(late, RATE_HZ) == pytest.approx(1.200)


async def test_probe_cli_agrees_with_the_servers_own_ttfa(engine: Engine, tmp_path: Path) -> None:
    out, png = tmp_path / "probe.json", tmp_path / "probe.png"
    async with running_gateway(engine) as base:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "voicewire.realtime.cli", "probe", "--url", f"http://{base}",
            "--duration", "4", "--concurrency", "3", "--tokens-per-s", "30", "--gap-s", "0",
            "--out", str(out), "--plot", str(png),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        stdout, stderr = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, stderr.decode()
    assert "ttfa_ms" in stdout.decode() and "/4 s" in stderr.decode()  # table, progress bar
    result = json.loads(out.read_text())
    turns = result["turns"]
    assert len(turns) >= 4 and all(t["reason"] == "completed" for t in turns)
    for t in turns:
        # Client-side audible TTFA vs the server's turn.done figure: they differ by the loopback
        # WebSocket delivery (well under a millisecond when the machine is idle).
        assert abs(t["ttfa_ms"] - t["server"]["ttfa_ms"]) <= 20, t
        assert t["ttfb_ms"] <= t["ttfa_ms"] < t["e2e_ms"]
    s = result["summary"]
    for q in ("p50", "p95"):
        assert abs(s["ttfa_ms"][q] - s["server_ttfa_ms"][q]) <= 20
    # the engine's part of the server's figure (first text to first audio on the gateway's loop)
    assert s["engine_ttfp_ms"]["n"] == len(turns)
    assert 0 < s["engine_ttfp_ms"]["p50"] <= s["server_ttfp_ms"]["p50"]
    assert s["underruns"] == 0
    # the probe's own process over its 4 s: some CPU, its loop watched
    own = s["probe_process"]
    assert 0 < own["cpu_s"] < own["wall_s"] and own["wall_s"] >= 4 and own["loop_lag_max_ms"] > 0, own
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000


async def test_probe_without_matplotlib_prints_the_summary_and_writes_the_json(
    engine: Engine, tmp_path: Path
) -> None:
    out = tmp_path / "probe.json"
    argv = ["probe", "--url", "URL", "--duration", "2", "--concurrency", "1", "--out", str(out)]
    no_matplotlib = (  # a fresh install without the plot extra: the import fails
        "import sys; sys.modules['matplotlib'] = None; from voicewire.realtime.cli import main; "
        "sys.exit(main(sys.argv[1:]))"
    )
    async with running_gateway(engine) as base:
        argv[2] = f"http://{base}"
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", no_matplotlib, *argv,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        stdout, stderr = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, stderr.decode()
    assert "ttfa_ms" in stdout.decode() and json.loads(out.read_text())["summary"]["completed"]
    assert "pip install 'voicewire[plot]'" in stderr.decode() and "Traceback" not in stderr.decode()
    assert "and probe.png" not in stdout.decode()  # no plot is claimed


async def test_probe_over_webrtc_reports_jitter_buffer_figures(engine: Engine) -> None:
    async with running_gateway(engine) as base:
        cfg = ProbeConfig(url=f"http://{base}", transport="webrtc", duration_s=3.0, gap_s=0.0)
        result = await probe(cfg, out=None)
    turns = result["turns"]
    assert turns and all(t["reason"] == "completed" for t in turns)
    for t in turns:
        # Over WebRTC the first audible sample also waits for the pacer, the Opus encoder's 6.5 ms
        # lookahead and SCTP/RTP delivery: ~5-25 ms on an idle loopback.
        assert 0 <= t["ttfa_ms"] - t["server"]["ttfa_ms"] <= 40, t
        assert 60 <= t["jitter_buffer_ms"] <= 150  # aiortc holds 4 packets (80 ms)
        assert t["rtp_jitter_ms"] is not None
        # audio_ms runs from the first to the last packet with sound: a turn's last 100-200 ms
        # can be digital silence (the end of its pause, the zero-padded last frame).
        assert 0 <= t["server"]["played_ms"] - t["audio_ms"] <= 250
    s = result["summary"]
    assert s["packets_received"] > 100 and s["packets_lost"] == 0
    assert result["probe"]["server"]["model"] == "hibari"  # /healthz, for the record


async def test_open_loop_opens_sessions_as_arrivals_need_them(engine: Engine) -> None:
    async with running_gateway(engine) as base:
        per_turn = ProbeConfig(
            url=f"http://{base}", rate_per_s=4.0, duration_s=2.0, session_per_turn=True, tokens_per_s=None
        )
        result = await probe(per_turn, out=None)
        capped = ProbeConfig(url=f"http://{base}", rate_per_s=20.0, duration_s=1.0, max_sessions=1, tokens_per_s=None)
        refused = await probe(capped, out=None)
    turns = result["turns"]
    assert turns and all(t["reason"] == "completed" for t in turns)
    assert result["summary"]["sessions"] == len(turns)  # one session per turn
    assert len({t["session"] for t in turns}) == len(turns)
    s = refused["summary"]
    assert s["sessions"] == 1 and s["errors"]["refused"] >= 1  # the cap holds; arrivals beyond it refused


async def test_an_open_loop_from_several_processes_is_one_result(engine: Engine) -> None:
    async with running_gateway(engine) as base:
        cfg = ProbeConfig(
            url=f"http://{base}", rate_per_s=6.0, duration_s=2.0, session_per_turn=True, tokens_per_s=None, procs=2
        )
        result = await probe(cfg, out=None)
    turns, s = result["turns"], result["summary"]
    assert len(turns) >= 4 and all(t["reason"] == "completed" for t in turns), [t["reason"] for t in turns]
    assert s["turns"] == s["sessions"] == len({t["session"] for t in turns}) == len(turns)
    assert {t["turn"] % 2 for t in turns} == {0, 1}  # both processes' arrivals
    assert [t["t_start_s"] for t in turns] == sorted(t["t_start_s"] for t in turns)
    assert s["probe_process"]["processes"] == 2 and s["probe_process"]["cpu_s"] > 0
    assert result["probe"]["server"]["model"] == "hibari"


async def test_probe_clients_spread_sessions_over_loopback_addresses(engine: Engine) -> None:
    from voicewire.realtime.limits import ClientQuotas

    async with running_gateway(engine, quotas=ClientQuotas(max_sessions=1)) as base:
        cfg = ProbeConfig(url=f"http://{base}", concurrency=3, duration_s=1.5, tokens_per_s=None, clients=3)
        spread = await probe(cfg, out=None)  # from one address the second session is refused (and raises)
    assert spread["summary"]["sessions"] == 3 and not spread["summary"]["errors"]["refused"]  # 3 clients, 1 each


async def test_barge_ins_cut_their_share_of_turns_where_the_listener_was(engine: Engine) -> None:
    async with running_gateway(engine) as base:
        cfg = ProbeConfig(
            url=f"http://{base}", rate_per_s=3.0, duration_s=2.0, session_per_turn=True, tokens_per_s=40.0,
            barge_in=0.5, barge_in_after_s=(0.3, 0.6), seed=3,
        )  # fmt: skip
        result = await probe(cfg, out=None)
    turns = result["turns"]
    cut = [t for t in turns if t["cut_ms"] is not None]
    whole = [t for t in turns if t["cut_ms"] is None]
    assert cut and whole, [t["cut_ms"] for t in turns]  # seed 3 draws both kinds
    # cut before or after the server sent all of it: cancelled, or completed and truncated
    assert all(300 <= t["cut_ms"] <= 600 and t["reason"] in ("cancelled", "completed") for t in cut)
    assert all(t["reason"] == "completed" for t in whole), [(t["reason"], t["server"]) for t in whole]
    # the server cut its account where the listener said it was, and the audio heard ends near it
    assert all(t["server"]["played_ms"] == pytest.approx(t["cut_ms"], abs=1) for t in cut)
    assert all(abs(t["audio_ms"] - t["cut_ms"]) <= 1 and t["cut_ms"] < t["server"]["audio_ms"] for t in cut)
    assert result["summary"]["cut"] == len(cut) and "cut 0.3-0.6 s in" in result["probe"]["description"]


def test_a_stall_while_the_probes_own_loop_was_held_is_counted_as_the_clients() -> None:
    """An arrival the probe's loop stamped late is no server's underrun: the summary says how many
    late turns had their longest stall overlap a hold of the probe's own loop."""
    from voicewire.engine.loop_lag import Stall
    from voicewire.realtime.client.probe import Probe
    from voicewire.realtime.client.probe_turn import TurnRecord

    p = Probe(ProbeConfig(), out=None)
    p._t0, p._wall_s = 100.0, 10.0
    p._lag.recent.append(Stall(t_end=102.0, seconds=0.05))  # the loop held 101.95 .. 102.0
    inside = TurnRecord(0, 0, 1.0, 5, underruns=1, max_stall_ms=30.0, max_stall_at_s=2.01)  # 101.98 .. 102.01
    after = TurnRecord(1, 0, 1.5, 5, underruns=1, max_stall_ms=30.0, max_stall_at_s=2.2)
    clean = TurnRecord(2, 0, 1.5, 5)
    assert p._own([inside, after, clean])["underran_while_held"] == 1
