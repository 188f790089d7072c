"""Model registry: a name -> a ``Model``. Heavy imports happen only for the model asked for.

Besides the built-in names, ``package.module:factory`` names any importable callable that takes
the model options as keyword arguments and returns a ``Model``: a user's own voice, or a test
double that ``voicewire serve`` runs like any other model.
"""

from __future__ import annotations

import importlib
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
    if ":" in name:
        module, _, attr = name.partition(":")
        factory = getattr(importlib.import_module(module), attr, None)
        if not callable(factory):
            raise ValueError(f"{module} has no callable {attr!r}")
        model = factory(**opts)
        if not isinstance(model, Model):
            raise ValueError(f"{name} returned {type(model).__name__}, not a voicewire Model")
        return model
    raise ValueError(f"unknown model {name!r}; known: {', '.join(MODEL_NAMES)} or package.module:factory")
