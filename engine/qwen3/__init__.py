"""Qwen3-TTS-12Hz, our own implementation for serving (talker, code predictor, streaming codec decoder).

    model = load_qwen3("/models/Qwen3-TTS-12Hz-0.6B-CustomVoice", device="cuda", dtype="bf16")
    model = load_qwen3(None, size="tiny")          # random weights, CPU tests
    model = load_qwen3(None, size="1.7b", device="cuda", dtype="bf16")   # random, real shapes

The engine registers it as model ``qwen3-tts`` (engine/models/__init__.py passes its options here).
"""

from __future__ import annotations

import os

import torch

from .config import Qwen3TTSConfig
from .errors import CheckpointError
from .model import Qwen3TTSModel
from .options import ExperimentalOptions, FusedSettings, ServeOptions
from .presets import SIZES, preset
from .tokenizer import Qwen2Tokenizer, StandInTokenizer
from .weights import build_modules, load_into, randomize, read_config

__all__ = [
    "SIZES",
    "CheckpointError",
    "ExperimentalOptions",
    "FusedSettings",
    "Qwen3TTSConfig",
    "Qwen3TTSModel",
    "ServeOptions",
    "load_qwen3",
    "parse_dtype",
    "preset",
]

_DTYPES = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
}


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return _DTYPES[dtype.lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {', '.join(_DTYPES)}") from None


def load_qwen3(
    checkpoint: str | None = None,
    size: str = "tiny",
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype = "float32",
    *,
    codec_dtype: str | torch.dtype | None = None,
    model_type: str = "custom_voice",
    seed: int = 0,
    max_slots: int = 16,
    max_batch_size: int = 16,
    max_seq_len: int = 1536,
    codec_mode: str = "stateful",
    windowed_left_context: int = 72,
    warmup: bool = False,
    options: ServeOptions | None = None,
) -> Qwen3TTSModel:
    """A Qwen3-TTS model for the engine.

    ``checkpoint``: a local directory in the official layout (its config decides the size and
    variant), or None for random weights of ``size`` ("tiny", "tiny-base", "0.6b", "1.7b") and
    ``model_type`` ("custom_voice" | "base"), seeded by ``seed``; random models stop after a forced
    frame count (``StreamParams.forced_frames``, else 3 frames per text token) instead of EOS.
    ``codec_dtype`` defaults to ``dtype``. ``options`` (all serving knobs, CUDA graphs included)
    replaces the individual ``max_*`` / ``codec_*`` arguments. ``warmup`` captures the CUDA graphs.
    Raises :class:`CheckpointError` for a bad checkpoint.
    """
    dev = torch.device(device)
    dt = parse_dtype(dtype)
    cdt = parse_dtype(codec_dtype) if codec_dtype is not None else dt
    options = options or ServeOptions(
        max_slots=max_slots,
        max_batch_size=max_batch_size,
        max_seq_len=max_seq_len,
        codec_mode=codec_mode,
        windowed_left_context=windowed_left_context,
    )
    speaker_weights = None
    if checkpoint is not None:
        directory = os.path.expanduser(checkpoint)
        cfg = read_config(directory)
        tokenizer: Qwen2Tokenizer | StandInTokenizer = Qwen2Tokenizer(directory, cfg.transformers_version)
        mods = build_modules(cfg, dev, dt, cdt)
        speaker_weights = load_into(mods, directory)
    else:
        cfg = preset(size, model_type)
        tokenizer = StandInTokenizer()
        mods = build_modules(cfg, dev, dt, cdt)
        randomize(mods, seed)
    model = Qwen3TTSModel(
        cfg,
        mods,
        tokenizer,
        options,
        random_weights=checkpoint is None,
        speaker_encoder_weights=speaker_weights,
    )
    if warmup:
        model.warmup()
    return model
