"""Qwen3-TTS-12Hz, our own implementation for serving (talker, code predictor, streaming codec decoder).

    model = load_qwen3("/models/Qwen3-TTS-12Hz-0.6B-CustomVoice", device="cuda", dtype="bf16")
    model = load_qwen3(None, size="tiny")          # random weights, CPU tests
    model = load_qwen3(None, size="1.7b", device="cuda", dtype="bf16")   # random, real shapes

The engine registers it as model ``qwen3-tts`` (engine/models/__init__.py passes its options here).
"""

from __future__ import annotations

import logging
import os
import time

import torch

from .. import compile_cache
from .config import Qwen3TTSConfig
from .cuda_graphs import powers_of_two
from .errors import CheckpointError
from .model import Qwen3TTSModel
from .options import (
    AUTO_SLOTS_CPU,
    ExperimentalOptions,
    FusedSettings,
    PoolSize,
    ServeOptions,
    block_bytes,
    pool_from_memory,
    slot_bytes,
)
from .presets import SIZES, preset
from .tokenizer import Qwen2Tokenizer, StandInTokenizer
from .voice_clone import VoiceCloner
from .weights import Modules, build_modules, load_into, randomize, read_config

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

log = logging.getLogger("voicewire.engine.qwen3")

# Codec graph buckets stop here: 64 x 12 frames is 22k frames/s on the H200 already, and a larger
# bucket's graph would cost memory and capture time for little (docs/performance-history.md).
CODEC_MAX_BATCH = 64
# Codec graphs up to this many frames on CUDA (1, 2, 4, 8, 12, 24, 48): streams seconds ahead of their
# listener decode in 24- and 48-frame chunks (ModelInfo.slack_chunk_frames), fewer and fuller calls.
CODEC_MAX_FRAMES_CUDA = 48

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
    max_slots: int | str = 16,
    max_batch_size: int = 16,
    max_seq_len: int = 1536,
    memory_share: float = 1.0,
    codec_mode: str = "stateful",
    windowed_left_context: int = 72,
    warmup: bool = False,
    options: ServeOptions | None = None,
    cache_dir: str | None = None,
) -> Qwen3TTSModel:
    """A Qwen3-TTS model for the engine.

    ``checkpoint``: a local directory in the official layout (its config decides the size and
    variant), or None for random weights of ``size`` ("tiny", "tiny-base", "0.6b", "1.7b") and
    ``model_type`` ("custom_voice" | "base"), seeded by ``seed``; random models stop after a forced
    frame count (``StreamParams.forced_frames``, else 3 frames per text token) instead of EOS.
    ``codec_dtype`` defaults to ``dtype``. ``max_slots="auto"``: as many as fit in this process's
    ``memory_share`` of the GPU, and the KV block pool fills the rest (options.py
    ``pool_from_memory``; 16 slots off CUDA); ``max_batch_size`` is then at most the slots.
    ``max_seq_len`` caps one stream's positions. ``options`` (all serving knobs, CUDA graphs
    included) replaces the individual ``max_*`` / ``codec_*`` arguments. ``warmup`` captures the
    CUDA graphs. ``cache_dir``: where compiled kernels are kept across starts on CUDA
    (compile_cache.py; None: the default). Raises :class:`CheckpointError` for a bad checkpoint,
    RuntimeError for a device that is not there.
    """
    t0 = time.perf_counter()
    dev = torch.device(device)
    if dev.type == "cuda":
        compile_cache.use(cache_dir)
    if dev.type == "cuda" and not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise RuntimeError(
            f"device {str(dev)!r} asked, but CUDA is not available (torch {torch.__version__}, {build})"
        )
    if isinstance(max_slots, str) and max_slots != "auto":
        raise ValueError(f"max_slots must be a number or 'auto', got {max_slots!r}")
    dt = parse_dtype(dtype)
    cdt = parse_dtype(codec_dtype) if codec_dtype is not None else dt
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
    t_weights = time.perf_counter()
    if options is None:
        pool = (
            _auto_pool(cfg, mods, dev, max_seq_len, memory_share)
            if max_slots == "auto"
            else PoolSize(int(max_slots), 0)
        )
        slots = pool.slots
        batch = min(max_batch_size, slots)
        options = ServeOptions(
            max_slots=slots,
            kv_blocks=pool.blocks,
            max_batch_size=batch,
            max_seq_len=max_seq_len,
            codec_mode=codec_mode,
            windowed_left_context=windowed_left_context,
            codec_batch_buckets=powers_of_two(min(batch, CODEC_MAX_BATCH)),
            codec_graph_frames=CODEC_MAX_FRAMES_CUDA if dev.type == "cuda" else ServeOptions.codec_graph_frames,
        )
    log.info(
        "qwen3-tts %s: %s, %s on %s, %d slots of %d positions, batch %d",
        cfg.model_type,
        f"random weights ({size} shapes)" if checkpoint is None else checkpoint,
        str(dt).removeprefix("torch."),
        dev,
        options.max_slots,
        options.max_seq_len,
        options.max_batch_size,
    )
    t_model = time.perf_counter()
    model = Qwen3TTSModel(
        cfg,
        mods,
        tokenizer,
        options,
        random_weights=checkpoint is None,
        speaker_encoder_weights=speaker_weights,
        cloner=_cloner(cfg, checkpoint, speaker_weights, seed, dev, dt),
    )
    t_end = time.perf_counter()
    # where a start's build goes: the weights (CUDA's own start-up included), the slots and KV pool
    # sized from free memory, the model's buffers and kernels' packed weights
    log.info(
        "built in %.1f s: weights %.1f s, pool %.1f s, model %.1f s",
        t_end - t0,
        t_weights - t0,
        t_model - t_weights,
        t_end - t_model,
    )
    host_threads(dev)
    if warmup:
        model.warmup()
    return model


def host_threads(dev: torch.device) -> None:
    """One intra-op torch thread beside a CUDA model, unless ``OMP_NUM_THREADS`` says otherwise.

    The host's torch work beside a CUDA model is small ops between launches, and torch's default
    of an OpenMP thread per core spins them all up on each: cores taken from the worker, the codec
    lanes and the gateway. At 120 turns/s on an H100 the worker spent 16.4 ms a step with them and
    6.5 ms without, and turns underran only with them (front_door_1.7b_omp16_h100.json against
    front_door_1.7b_h100.json). A model on the CPU keeps them: its work is the model itself.
    """
    if dev.type == "cuda" and "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)


def _cloner(
    cfg: Qwen3TTSConfig,
    checkpoint: str | None,
    speaker_weights: dict[str, torch.Tensor] | None,
    seed: int,
    dev: torch.device,
    dt: torch.dtype,
) -> VoiceCloner | None:
    """A Base model's cloner (both encoders); None for the other variants, which cannot clone."""
    if cfg.model_type != "base" or cfg.speaker_encoder is None:
        return None
    if checkpoint is None:
        return VoiceCloner.random(cfg, seed=seed + 1, device=dev, dtype=dt)
    if not speaker_weights:
        log.warning("this Base checkpoint has no speaker encoder weights: voice cloning is off")
        return None
    return VoiceCloner.from_checkpoint(os.path.expanduser(checkpoint), speaker_weights, dev, dt)


def _auto_pool(
    cfg: Qwen3TTSConfig, mods: Modules, dev: torch.device, max_seq_len: int, share: float
) -> PoolSize:
    """``max_slots="auto"``: the slots and KV blocks that fit next to the loaded weights (weights
    first: what they take is then known, not estimated). Off CUDA: 16 slots, full rows of blocks."""
    if dev.type != "cuda":
        return PoolSize(AUTO_SLOTS_CPU, 0)
    mods.codec.prepare()  # measures the decoder's state row; the model prepares it again, the same way
    t = cfg.talker
    per_slot = slot_bytes(
        max_seq_len=max_seq_len,
        codec_state_width=mods.codec.state_width,
        codec_elem_bytes=next(mods.codec.parameters()).element_size(),
        talker_vocab=t.vocab_size,
    )
    per_block = block_bytes(
        num_layers=t.num_layers,
        kv_heads=t.num_kv_heads,
        head_dim=t.head_dim,
        elem_bytes=next(mods.talker.parameters()).element_size(),
    )
    free, total = torch.cuda.mem_get_info(dev)
    own = torch.cuda.memory_reserved(dev)
    pool = pool_from_memory(free, total, per_slot, per_block, own_bytes=own, share=share)
    gib = 1 << 30
    log.info(
        "max_slots auto on %s: %d slots (%.1f MiB each), %d KV blocks (%.1f MiB each) from %.1f of %.1f GiB "
        "free, %.1f GiB held by this process, share %.2f",
        dev,
        pool.slots,
        per_slot.total / (1 << 20),
        pool.blocks,
        per_block / (1 << 20),
        free / gib,
        total / gib,
        own / gib,
        share,
    )
    if pool.slots < 1:
        raise RuntimeError(
            f"not enough free memory on {dev} for one stream ({free / gib:.1f} GiB free): free the GPU"
        )
    return pool
