"""How a decode-attention step is launched: splits of the keys and tile sizes, chosen on the host
from the batch and a bound on the lengths the caller already knows (no device->host sync), once per
step and reused by every layer; and the block table of a slot-contiguous cache.

Splits: the fewest that fill whole waves of programs across the GPU's multiprocessors, each split
keeping at least MIN_TOKENS_PER_SPLIT tokens (FlashAttention-2's num_splits heuristic, with our program
size). The kernels themselves are in decode_attention.py.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton

from voicewire.kernels.launch_checks import MIN_DOT_DIM

# Tile of keys per loop iteration: 64 tokens x 128 dims x 2 B = 16 KiB of K (and as much V) per stage,
# loaded with cp.async, 16 B per thread per load (seen in the sm_90 PTX of Triton 3.9).
DEFAULT_BLOCK_N = 64
# fp32 doubles the tile bytes; 32 tokens keeps the same shared-memory footprint (CPU tests, debugging).
FP32_BLOCK_N = 32
DEFAULT_NUM_WARPS = 4
DEFAULT_NUM_STAGES = 3
# A split shorter than this (two 64-token tiles) is mostly prologue and epilogue: its q load, pipeline
# fill and fp32 partial write cost about as much as the K/V it reads.
MIN_TOKENS_PER_SPLIT = 128
# Upper bound on splits: the combine kernel holds all S partials of a head in one tile.
MAX_SPLITS = 64
# Programs resident per multiprocessor with the default config (bf16, 64-token tiles, 3 stages): ptxas
# reports 80 registers x 128 threads (room for 6) and Triton 70 KiB of shared memory (3 fit in an H200
# SM's 228 KiB). A wave is this many times the SM count.
PROGRAMS_PER_SM = 3
# Take the fewest splits whose wave efficiency (programs / whole waves' capacity) is within this factor
# of the best reachable: FlashAttention-2's num_splits heuristic, with our program size.
WAVE_EFFICIENCY_SLACK = 0.85
# Multiprocessor count assumed off-GPU (the CPU interpreter); it only shapes the split plan.
CPU_FAKE_SM_COUNT = 8


@dataclass(frozen=True)
class DecodeAttentionPlan:
    """Launch shape for one decode-attention step; computed on the host, reused by every layer."""

    max_len_bound: int  # upper bound on every row's length this step (tokens); keys past it are never read
    num_splits: int  # KV splits per (row, KV head); 1 = single pass, no workspace, no combine kernel
    tokens_per_split: int  # tokens each split covers, a multiple of block_n
    block_n: int  # keys per loop iteration
    num_warps: int
    num_stages: int  # software-pipelining depth of the K/V loads


@functools.lru_cache(maxsize=16)
def _multiprocessor_count(device: torch.device) -> int:
    if device.type != "cuda":
        return CPU_FAKE_SM_COUNT
    return int(torch.cuda.get_device_properties(device).multi_processor_count)


def _choose_splits(programs: int, wave: int, max_splits: int) -> int:
    """Fewest splits that keep whole waves nearly full. E.g. H200 (132 SMs, wave 396), batch 16 x 8 KV
    heads = 128 programs: 1 split fills 32% of one wave, 2 fill 65%, 3 fill 97%: take 3. Batch 128
    (1024 programs, 2 waves 86% full) takes 1: splitting adds combine work without filling much."""

    def efficiency(splits: int) -> float:
        n = programs * splits
        return n / (triton.cdiv(n, wave) * wave)

    best = max(efficiency(s) for s in range(1, max_splits + 1))
    return next(s for s in range(1, max_splits + 1) if efficiency(s) >= WAVE_EFFICIENCY_SLACK * best)


def plan_decode_attention(
    batch: int,
    num_kv_heads: int,
    max_len_bound: int,
    device: torch.device | str,
    dtype: torch.dtype = torch.bfloat16,
    *,
    num_splits: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
) -> DecodeAttentionPlan:
    """Choose splits and tiles for `batch` rows whose lengths are all <= `max_len_bound`.

    The keyword overrides exist for tests and for the benchmark's config sweep.
    """
    if batch < 1 or num_kv_heads < 1:
        raise ValueError(f"batch ({batch}) and num_kv_heads ({num_kv_heads}) must be >= 1")
    if max_len_bound < 1:
        raise ValueError(f"max_len_bound must be >= 1, got {max_len_bound}")
    if block_n is None:
        block_n = FP32_BLOCK_N if dtype == torch.float32 else DEFAULT_BLOCK_N
        # no wider than the longest row: the code predictor's 16-position cache takes 16-key tiles
        block_n = min(block_n, max(MIN_DOT_DIM, triton.next_power_of_2(max_len_bound)))
    if block_n < MIN_DOT_DIM or block_n & (block_n - 1):
        raise ValueError(f"block_n must be a power of two >= {MIN_DOT_DIM}, got {block_n}")

    if num_splits is None:
        wave = PROGRAMS_PER_SM * _multiprocessor_count(torch.device(device))
        max_splits = min(MAX_SPLITS, triton.cdiv(max_len_bound, MIN_TOKENS_PER_SPLIT))
        num_splits = _choose_splits(batch * num_kv_heads, wave, max_splits)
    if not 1 <= num_splits <= MAX_SPLITS:
        raise ValueError(f"num_splits must be in [1, {MAX_SPLITS}], got {num_splits}")
    tokens_per_split = triton.cdiv(triton.cdiv(max_len_bound, num_splits), block_n) * block_n
    # Rounding the split up to whole tiles can leave trailing splits empty: drop them.
    num_splits = triton.cdiv(max_len_bound, tokens_per_split)
    return DecodeAttentionPlan(
        max_len_bound=max_len_bound,
        num_splits=num_splits,
        tokens_per_split=tokens_per_split,
        block_n=block_n,
        num_warps=DEFAULT_NUM_WARPS if num_warps is None else num_warps,
        num_stages=DEFAULT_NUM_STAGES if num_stages is None else num_stages,
    )


def contiguous_block_table(num_slots: int, device: torch.device | str) -> torch.Tensor:
    """(num_slots, 1) int32, row s = [s]: a slot-contiguous (num_slots, Hkv, L, D) cache as one page of
    L tokens per slot. Make it once and keep it (graphs capture its address)."""
    return torch.arange(num_slots, dtype=torch.int32, device=device)[:, None]
