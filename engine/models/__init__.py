"""Model registry: a name -> a ``Model``. Heavy imports happen only for the model asked for."""

from __future__ import annotations

from collections.abc import Mapping

from ..model import Model

MODEL_NAMES = ("hibari", "qwen3-tts")


def load_model(name: str, options: Mapping[str, object] | None = None) -> Model:
    opts = dict(options or {})
    if name == "hibari":
        from .hibari_voice import HibariModel

        return HibariModel(**opts)  # type: ignore[arg-type]
    if name == "qwen3-tts":
        from ..qwen3 import load_qwen3

        return load_qwen3(**opts)  # type: ignore[arg-type]
    raise ValueError(f"unknown model {name!r}; known: {', '.join(MODEL_NAMES)}")
