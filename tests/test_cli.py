"""`voicewire say` as a user runs it: a subprocess writing a WAV file."""

import argparse
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import wave
from pathlib import Path

import numpy as np

from tests.asr import transcribe, wer
from tests.conftest import free_port

REPO = Path(__file__).resolve().parents[1]

TEXT = "Good afternoon! The meeting moved to room 12, and it starts at three thirty."


def test_say_writes_intelligible_wav(tmp_path: Path) -> None:
    out = tmp_path / "out.wav"
    proc = subprocess.run(
        [sys.executable, "-m", "voicewire.realtime.cli", "say", TEXT, "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    with wave.open(str(out)) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (24_000, 1, 2)
        pcm = np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float32) / 32768.0
    assert pcm.size > 24_000 * 2
    assert wer(TEXT, transcribe(pcm, 24_000)) <= 0.15


def test_say_refuses_empty_text_and_unknown_model(tmp_path: Path) -> None:
    run = [sys.executable, "-m", "voicewire.realtime.cli", "say"]
    assert subprocess.run([*run, "  ", "-o", str(tmp_path / "x.wav")], capture_output=True).returncode == 2
    proc = subprocess.run([*run, "hi", "--model", "nope"], capture_output=True, text=True)
    assert proc.returncode == 2 and "unknown model" in proc.stderr


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return int(r.status)
    except urllib.error.HTTPError as err:
        return int(err.code)


def test_serve_is_live_while_it_warms_and_ready_only_when_warm() -> None:
    """`voicewire serve` with a model whose warm-up takes seconds (as Qwen3-TTS graph capture
    does): a liveness probe gets 200 while the model still warms (readiness 503), then readiness
    200 once warm. Not how soon: start-up seconds belong to the benchmarks (a loaded CI core takes
    seconds just to import)."""
    port = free_port()
    env = {**os.environ, "VOICEWIRE_TEST_WARMUP_S": "4"}
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "voicewire.realtime.cli",
            "serve",
            "--port",
            str(port),
            "--model",
            "tests.doubles:slow_warmup",
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        live = False
        while not live and time.monotonic() - t0 < 30:
            with contextlib.suppress(OSError):
                live = _get(f"{base}/healthz") == 200
            time.sleep(0.05)
        assert live, "/healthz never answered"
        assert _get(f"{base}/readyz") == 503  # live before warm
        ready_s = None
        while time.monotonic() - t0 < 60:
            if _get(f"{base}/readyz") == 200:
                ready_s = time.monotonic() - t0
                break
            time.sleep(0.1)
        assert ready_s is not None and ready_s >= 4.0, ready_s
        req = urllib.request.Request(
            f"{base}/v1/audio/speech",
            data=b'{"input": "Ready now."}',
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            assert r.status == 200 and len(r.read()) > 10_000
        # the gateway's own loop is watched from ready on (its stalls would hold every session)
        with urllib.request.urlopen(f"{base}/metrics", timeout=5) as r:
            metrics = r.read().decode()
        lag = re.search(r"^voicewire_gateway_loop_lag_max_since_ready_seconds (\S+)$", metrics, re.M)
        assert lag is not None and 0.0 < float(lag[1]) < 5.0, metrics
        assert re.search(r"^voicewire_gateway_gc_pause_max_since_ready_seconds \S+$", metrics, re.M)
        assert re.search(r"^voicewire_gateway_loop_stalls_total \S+$", metrics, re.M)
        cpu = re.search(r"^process_cpu_seconds_total (\S+)$", metrics, re.M)  # the gateway process's own
        assert cpu is not None and float(cpu[1]) > 0, metrics
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out


def test_serve_refuses_a_taken_port_in_one_line() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "voicewire.realtime.cli", "serve", "--port", str(port)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert proc.returncode == 1
    assert "cannot listen" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_serve_flags_set_the_per_client_quotas() -> None:
    from voicewire.engine import EngineConfig
    from voicewire.realtime.cli import build_parser, gateway_config

    flags = "--max-sessions-per-client 5 --max-speech-per-client 0 --no-fair-share"
    args = build_parser().parse_args(["serve", *flags.split(), "--max-voices-per-client", "3", "--max-voices", "40"])
    config = gateway_config(args, EngineConfig())
    assert (config.quotas.max_sessions, config.quotas.max_speech_requests, config.quotas.fair_share) == (5, 0, False)
    assert config.quotas.speech_requests(64) is None  # 0: no per-client limit
    assert (config.voice_limits.max_voices_per_client, config.voice_limits.max_voices) == (3, 40)
    defaults = gateway_config(build_parser().parse_args(["serve"]), EngineConfig())
    assert defaults.quotas.sessions(256) == 64 and defaults.quotas.fair_share
    assert defaults.max_speech_requests is None  # the engine's capacity (tests/gateway/test_limits.py)
    lowered = build_parser().parse_args(["serve", "--max-speech-requests", "12", "--max-sessions", "30"])
    assert (gateway_config(lowered, EngineConfig()).max_speech_requests, lowered.max_sessions) == (12, 30)


def test_serve_refuses_a_bad_flag_value_in_one_line() -> None:
    for flags in (["--api-key", "shortkey"], ["--max-sessions-per-client", "-1"]):
        proc = subprocess.run(
            [sys.executable, "-m", "voicewire.realtime.cli", "serve", "--port", str(free_port()), *flags],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 2, (flags, proc.stderr)
        assert proc.stderr.startswith("voicewire serve: ") and "Traceback" not in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_serve_help_names_every_flag_and_its_default() -> None:
    from voicewire.realtime.cli import build_parser

    serve = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices["serve"]
    for action in serve._actions:
        assert action.help, f"{action.option_strings} has no help"
    text = " ".join(serve.format_help().split())
    for shown in ("(default: 127.0.0.1)", "(default: 8080)", "(default: info)"):
        assert shown in text


def test_serve_logging_leaves_out_aiortcs_ice_chatter() -> None:
    import logging

    from voicewire.realtime.cli import _setup_logging

    root, aioice = logging.getLogger(), logging.getLogger("aioice")
    saved = (root.handlers[:], root.level, aioice.level)
    try:
        root.setLevel(logging.INFO)  # what --log-level info gives the root logger
        _setup_logging("info", "text")
        assert not aioice.isEnabledFor(logging.INFO) and aioice.isEnabledFor(logging.WARNING)
    finally:
        root.handlers[:], root.level = saved[0], saved[1]
        aioice.setLevel(saved[2])


def test_a_bad_checkpoint_is_named_before_any_missing_package(tmp_path: Path) -> None:
    from voicewire.realtime.cli import build_parser
    from voicewire.realtime.engine_flags import unmet_requirements

    args = build_parser().parse_args(["serve", "--model", "qwen3-tts", "--checkpoint", str(tmp_path / "nope")])
    assert "not a Qwen3-TTS checkpoint directory" in (unmet_requirements(args) or "")
    # in a subprocess that has none of the packages: one line names them all
    no_packages = (
        "import sys; sys.modules.update(torch=None, safetensors=None, tokenizers=None)\n"
        "import importlib.util; real = importlib.util.find_spec\n"
        "importlib.util.find_spec = lambda n, *a: None if n in ('torch', 'safetensors', 'tokenizers') else real(n, *a)\n"
        "from voicewire.realtime.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text("{}")
    proc = subprocess.run(
        [sys.executable, "-c", no_packages, "serve", "--model", "qwen3-tts", "--checkpoint", str(tmp_path / "ckpt")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "needs torch, safetensors, tokenizers" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
