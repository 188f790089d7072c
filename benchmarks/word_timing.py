"""Word timings of the embedded voice against the audio: known boundaries and faster-whisper.

    python benchmarks/word_timing.py --out benchmarks/results/word_timing_cpu.json

Known boundaries: turns of one-word sentences, each word's truth the first audible 10 ms window
after the voice's pause; continuous speech: faster-whisper tiny.en ``word_timestamps=True``
(tests/engine/word_accuracy.py has both, shared with the test that bounds them). Run from the
repository root (it imports ``tests``); ``benchmarks/cpu.sh words`` adds the meta block.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.engine.word_accuracy import CONTINUOUS_TURNS, ONE_WORD_TURNS, measure
from voicewire.engine import Engine, EngineConfig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    engine = Engine(EngineConfig(model="hibari")).start()
    try:
        figures = measure(engine)
    finally:
        engine.close()
    result = {
        "model": "hibari (embedded voice, default voice)",
        "method": "duration predictor frames per phoneme id -> words (engine/models/hibari_voice.py)",
        "turns": {"known_boundaries": list(ONE_WORD_TURNS), "continuous": list(CONTINUOUS_TURNS)},
        "figures": figures,
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
