"""Qwen3-TTS on the CPU needs torch, not Triton: an install without the kernels extra serves
(random weights, the tiny shapes) on the torch paths."""

from __future__ import annotations

import subprocess
import sys

WITHOUT_TRITON = """
import sys
sys.modules.update({"triton": None, "triton.language": None})  # as if it were not installed
import numpy as np
from voicewire.engine import Engine, EngineConfig
engine = Engine(EngineConfig(model="qwen3-tts", model_options={"size": "tiny", "device": "cpu"})).start()
try:
    import asyncio

    async def speak():
        stream = engine.open_stream(forced_frames=6)
        stream.push_text("No kernels here.")
        stream.end()
        return sum([c.pcm.size async for c in stream])

    print("samples", asyncio.run(speak()))
finally:
    engine.close()
"""


def test_the_cpu_engine_starts_and_speaks_without_triton() -> None:
    proc = subprocess.run([sys.executable, "-c", WITHOUT_TRITON], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert int(proc.stdout.split("samples")[-1]) > 0
