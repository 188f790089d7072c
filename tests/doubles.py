"""Model doubles that ``voicewire serve --model tests.doubles:NAME`` (and tests) run like any model.

They wrap the real embedded voice and change one behaviour, so everything else a test sees is real.
"""

from __future__ import annotations

import os
import time

from voicewire.engine.models.hibari_voice import HibariModel

SLOW_WARMUP_S = float(os.environ.get("VOICEWIRE_TEST_WARMUP_S", "4.0"))


class SlowWarmupModel(HibariModel):
    """The embedded voice with a warm-up as slow as Qwen3-TTS graph capture."""

    def __init__(self, warmup_s: float = SLOW_WARMUP_S, **options: object) -> None:
        super().__init__(**options)  # type: ignore[arg-type]
        self.warmup_s = warmup_s

    def warmup(self) -> None:
        time.sleep(self.warmup_s)
        super().warmup()


def slow_warmup(**options: object) -> SlowWarmupModel:
    return SlowWarmupModel(**options)  # type: ignore[arg-type]


class NoWeightsModel(HibariModel):
    """A model whose weights cannot be loaded: its start fails as a missing checkpoint's would."""

    def __init__(self, **options: object) -> None:
        raise RuntimeError("no weights at /nonexistent")


def no_weights(**options: object) -> NoWeightsModel:
    return NoWeightsModel(**options)
