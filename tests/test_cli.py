"""`voicewire say` as a user runs it: a subprocess writing a WAV file."""

import subprocess
import sys
import wave
from pathlib import Path

import numpy as np

from tests.asr import transcribe, wer

TEXT = "Good afternoon! The meeting moved to room 12, and it starts at three thirty."


def test_say_writes_intelligible_wav(tmp_path: Path) -> None:
    out = tmp_path / "out.wav"
    proc = subprocess.run(
        [sys.executable, "-m", "realtime.cli", "say", TEXT, "-o", str(out)],
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
    run = [sys.executable, "-m", "realtime.cli", "say"]
    assert subprocess.run([*run, "  ", "-o", str(tmp_path / "x.wav")], capture_output=True).returncode == 2
    proc = subprocess.run([*run, "hi", "--model", "nope"], capture_output=True, text=True)
    assert proc.returncode == 2 and "invalid choice" in proc.stderr
