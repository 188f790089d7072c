"""`voicewire serve --model qwen3-tts`: the flags become the engine's and the model's options, a
random-weight model is asked for explicitly and says so, and a model that cannot start ends
serve with one line. The slots-from-memory arithmetic on fake numbers (no GPU here)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import free_port
from voicewire.realtime import cli, engine_flags

REPO = Path(__file__).resolve().parents[1]
SERVE = [sys.executable, "-m", "voicewire.realtime.cli", "serve"]
MIB = 1 << 20


def _config(*flags: str) -> tuple[dict[str, object], int]:
    args = cli.build_parser().parse_args(["serve", "--model", "qwen3-tts", *flags])
    engine = engine_flags.to_engine_config(args)
    return engine.model_options, engine.max_streams


# --- flags -> options ------------------------------------------------------------------------------
def test_cuda_defaults_are_the_benchmarked_configuration() -> None:
    options, max_streams = _config("--random-weights", "--qwen-size", "1.7b", "--device", "cuda")
    assert options["dtype"] == "bf16"
    assert options["max_slots"] == "auto" and max_streams == engine_flags.AUTO_MAX_STREAMS
    assert options["max_batch_size"] == 512 and options["max_seq_len"] == 1536
    # the engine profile's default (it cannot import the flags' module on a bare device)
    from benchmarks.profile_serve import SERVED_MAX_BATCH

    assert SERVED_MAX_BATCH == engine_flags.CUDA_MAX_BATCH
    assert options["memory_share"] == 1.0 and options["checkpoint"] is None


def test_cpu_defaults_and_explicit_flags() -> None:
    options, max_streams = _config("--random-weights")
    assert (options["dtype"], options["max_slots"], options["max_batch_size"]) == ("float32", 16, 16)
    assert max_streams == 16
    options, max_streams = _config(
        "--checkpoint", "/m", "--device", "cuda", "--dtype", "fp16", "--max-streams", "40",
        "--max-batch", "32", "--max-seq-len", "512",
    )  # fmt: skip
    assert options["max_slots"] == 40 and max_streams == 40  # the engine caps at min(both)
    assert (options["dtype"], options["max_batch_size"], options["max_seq_len"]) == ("fp16", 32, 512)
    assert options["checkpoint"] == "/m"


def test_replicas_on_one_gpu_split_its_memory() -> None:
    assert _config("--random-weights", "--device", "cuda", "--replicas", "2")[0]["memory_share"] == 0.5
    options = _config("--random-weights", "--devices", "cuda:0,cuda:1", "--replicas", "3")[0]
    assert options["memory_share"] == 0.5 and options["device"] == "cuda:0"
    assert _config("--random-weights", "--devices", "cuda:0,cuda:1")[0]["memory_share"] == 1.0


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        ((), "--random-weights"),
        (("--checkpoint", "/m", "--random-weights"), "exclude"),
        (("--random-weights", "--devices", "cpu,cuda:0"), "mix"),
    ],
)
def test_unservable_flags_are_usage_errors(flags: tuple[str, ...], says: str) -> None:
    args = cli.build_parser().parse_args(["serve", "--model", "qwen3-tts", *flags])
    with pytest.raises(engine_flags.UsageError, match=says):
        engine_flags.to_engine_config(args)


def test_qwen3_flags_refused_for_another_model_and_max_streams_kept() -> None:
    args = cli.build_parser().parse_args(["serve", "--dtype", "bf16"])
    with pytest.raises(engine_flags.UsageError, match="--dtype applies to --model qwen3-tts only"):
        engine_flags.to_engine_config(args)
    assert engine_flags.to_engine_config(cli.build_parser().parse_args(["serve", "--max-streams", "8"])).max_streams == 8


def test_auto_streams_cap_matches_the_model_side() -> None:
    from voicewire.engine.qwen3.options import AUTO_MAX_SLOTS

    assert engine_flags.AUTO_MAX_STREAMS == AUTO_MAX_SLOTS


def test_auto_slots_on_the_cpu_and_random_weights_in_model_info() -> None:
    from voicewire.engine.qwen3 import load_qwen3

    model = load_qwen3(None, "tiny", max_slots="auto", max_batch_size=128, max_seq_len=64)
    assert model.info.max_slots == 16 and model.info.max_batch_size == 16 and model.info.random_weights
    assert model.options.codec_batch_buckets == (1, 2, 4, 8, 16)
    with pytest.raises(ValueError, match="auto"):
        load_qwen3(None, "tiny", max_slots="many")
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        load_qwen3(None, "tiny", device="cuda")


# --- the command as a user runs it -----------------------------------------------------------------
def test_serve_without_weights_named_is_one_line_exit_2() -> None:
    proc = subprocess.run([*SERVE, "--model", "qwen3-tts"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "--checkpoint" in proc.stderr, proc.stderr
    assert "--random-weights" in proc.stderr


def test_serve_with_a_missing_checkpoint_ends_in_one_line() -> None:
    proc = subprocess.run(
        [*SERVE, "--model", "qwen3-tts", "--checkpoint", "/nonexistent", "--port", str(free_port())],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    # said before anything starts, and before any package that might be missing
    assert proc.stderr.strip() == (
        "voicewire serve: --checkpoint /nonexistent: not a Qwen3-TTS checkpoint directory (no config.json there)"
    ), proc.stderr


def test_serve_random_weights_says_so_in_healthz() -> None:
    port = free_port()
    proc = subprocess.Popen(
        [*SERVE, "--model", "qwen3-tts", "--random-weights", "--qwen-size", "tiny", "--port", str(port)],
        cwd=REPO,
        env={**os.environ},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    health: dict[str, object] = {}
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            with contextlib.suppress(OSError), urllib.request.urlopen(f"{base}/readyz", timeout=1) as r:
                if r.status == 200:
                    break
            time.sleep(0.2)
        with urllib.request.urlopen(f"{base}/healthz", timeout=5) as r:
            health = json.loads(r.read())
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert health.get("model") == "qwen3-tts" and health.get("random_weights") is True, (health, out)
    assert "random weights" in out
    assert proc.returncode == 0, out
