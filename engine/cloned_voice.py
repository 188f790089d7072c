"""A voice cloned from reference audio, in the form the engine moves around: named numpy arrays.

A model that clones (``ModelInfo.voice_encoder`` is not empty) turns a reference clip into a
``ClonedVoice`` (``Model.clone_voice``); a stream speaks with it when its ``StreamParams.extra``
holds it under ``CLONED_VOICE_KEY``. The arrays are the model's own derived artifacts (Qwen3-TTS
Base: the x-vector and the reference codes) and mean nothing to anyone else, but their form is
plain: no torch, so the gateway can persist them (safetensors) and they cross to an engine core
as raw bytes (``engine/core/messages.py``). A voice fits only the encoder that made it: the
model refuses one whose ``encoder`` is not its own.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

CLONED_VOICE_KEY = "voice_profile"  # the StreamParams.extra key a stream's cloned voice goes under


@dataclass(frozen=True)
class ClonedVoice:
    encoder: str  # the ModelInfo.voice_encoder that derived it
    arrays: dict[str, np.ndarray]  # the model's artifacts by name, on the host
    ref_text: str = ""  # the reference transcript (empty: the model used the audio alone)

    def __post_init__(self) -> None:
        if not self.encoder:
            raise ValueError("a cloned voice names the encoder that made it")
        for name, a in self.arrays.items():
            if not isinstance(a, np.ndarray):
                raise ValueError(f"cloned voice array {name!r} is a {type(a).__name__}, not an ndarray")

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values())

    @property
    def finite(self) -> bool:
        """No NaN or infinity in a float array: a voice with one speaks noise or nothing at all."""
        return all(bool(np.isfinite(a).all()) for a in self.arrays.values() if a.dtype.kind in "fc")


class CloningNotSupported(Exception):
    """The served model cannot clone voices (its ``ModelInfo.voice_encoder`` is empty)."""
