"""Qwen3-TTS with its device work short-circuited: the served model's host code, at serving scale,
on the CPU (host_overhead.py ``--device qwen3``).

A tiny random-weight ``Qwen3TTSModel`` with the served engine's slots, batch and graph buckets, whose
graph bodies (the decode step, the prefill, the codec; ``CudaGraphs``' entries) and eager fallbacks
return ready-made outputs of the right shape instead of computing: every host line the model runs
per step, per stream and per chunk (readiness, prompts, packing rows, KV block tables, text uploads,
recording codes, the codec's packing and PCM slicing) runs as served, and the device costs nothing.
The engine sees it as the CUDA model: two frame steps in flight, the codec overlapped, an urgent
lane (which the CPU codec runner folds into its one lane). The static codes are random valid codes,
a different row per batch row, so no stream stops early (forced lengths, no EOS).
"""

from __future__ import annotations

import time

import numpy as np
import torch
from torch import Tensor

from voicewire.engine.qwen3 import CODEC_MAX_BATCH, CODEC_MAX_FRAMES_CUDA, ServeOptions, load_qwen3
from voicewire.engine.qwen3.model import Qwen3TTSModel

# KV blocks of the pool: ~4 blocks (256 positions) a stream at 512 streams, as the served pool
# sized from free memory gives; a full row per slot would allocate 12k tiny blocks for nothing.
KV_BLOCKS_PER_SLOT = 4


def null_device_qwen3(
    max_slots: int, max_batch: int, max_seq_len: int = 1536, seed: int = 0, step_s: float = 0.0
) -> Qwen3TTSModel:
    """``step_s``: a frame step's device time, waited without the interpreter's lock (as a CUDA sync
    waits) inside the step, so streams live as long as a GPU's steps make them; 0: none."""
    opts = ServeOptions(
        max_slots=max_slots,
        max_batch_size=max_batch,
        max_seq_len=max_seq_len,
        kv_blocks=1 + KV_BLOCKS_PER_SLOT * max_slots,
        codec_batch_buckets=tuple(b for b in (1, 2, 4, 8, 16, 32, 64) if b <= min(max_batch, CODEC_MAX_BATCH)),
        codec_graph_frames=CODEC_MAX_FRAMES_CUDA,
    )
    torch.manual_seed(seed)
    model = load_qwen3(None, "tiny", options=opts, seed=seed)
    short_circuit(model, seed, step_s)
    # as the engine drives the CUDA model (model.py: steps_in_flight 2 on CUDA, the codec overlapped)
    model.steps_in_flight, model.decode_overlaps, model.urgent_decode = 2, True, True
    return model


def short_circuit(model: Qwen3TTSModel, seed: int, step_s: float = 0.0) -> None:
    """Every graph body and eager device path of ``model`` returns a static output: no compute."""
    rng = np.random.default_rng(seed)
    q = model.cfg.talker.num_code_groups
    codebook = model.cfg.codec.codebook_size
    frame_samples = model.cfg.codec.frame_samples
    outputs: dict[tuple[int, ...], Tensor] = {}

    def static(shape: tuple[int, ...]) -> Tensor:
        if shape not in outputs:
            if len(shape) == 2 and shape[1] == q:  # codes: random valid codes, never EOS
                outputs[shape] = torch.from_numpy(rng.integers(0, codebook, shape).astype(np.int64))
            else:
                outputs[shape] = torch.zeros(shape, dtype=torch.float32)
        return outputs[shape]

    def decode_body(slots: Tensor) -> Tensor:
        if step_s:
            time.sleep(step_s)
        return static((slots.shape[0], q))

    def prefill_body(rows: Tensor) -> Tensor:
        return static((rows.shape[0], 1))

    def codec_body(packed: Tensor) -> Tensor:
        b, width = packed.shape
        return static((b, (width - 2) // q * frame_samples))

    for key, entry in model.graphs._entries.items():
        kind = key[0] if isinstance(key, tuple) else key
        entry.body = decode_body if kind == "decode" else prefill_body if kind == "prefill" else codec_body
    model.step.prefill = prefill_body  # type: ignore[method-assign]  # prompts past the length buckets
    model.codec_runner.body = codec_body  # type: ignore[method-assign]  # chunks past the graphed lengths
