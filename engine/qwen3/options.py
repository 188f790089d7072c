"""Serving options of one Qwen3-TTS model instance (not part of the checkpoint).

``ServeOptions`` holds what a user sizes and tunes a deployment with. ``ExperimentalOptions``
holds the switches that pick another implementation of the same computation (the unfused layers,
torch.compile, the torch SnakeBeta, the fused path's launch variants): they exist so the
benchmarks can measure the alternatives and the tests can compare them; the defaults are what
serves, and the measurements behind them are in docs/performance-history.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field

CODEC_MODES = ("stateful", "windowed")
GEMV_MAX_ROWS = 2  # kernels/gemv.py's GEMV_MAX_ROWS: the most rows its one-/two-row kernel takes


@dataclass(frozen=True)
class FusedSettings:
    """How the fused decode path runs (fused_decode.py)."""

    # batches above this many rows run the wide projections on norm + cuBLAS + SwiGLU
    cublas_rows: int = 8
    # and above this many, o and down too (cuBLAS, then the residual add); below, the fused epilogue.
    # 1.7B frame step on the H200: at 128 rows the fused epilogue wins (7.0 against 7.6 ms), at 256
    # cuBLAS (9.2 against 12.0 ms) and at 512 (13.6 against 20.4 ms)
    residual_cublas_rows: int = 128
    # the prompt's prefill on these kernels, its positions as rows (False: the unfused talker layers)
    prefill: bool = True
    # programmatic dependent launch on sm_90+ (kernels/pdl.py)
    pdl: bool = True
    # of each program's weight band, this much is pulled into L2 while the kernel before it runs
    prefetch_kib: int = 128
    # linears of at most this many rows run on the one-/two-row kernel, which loads its weights into
    # registers before the wait (kernels/gemv.py); 0 = always the tiled kernel
    gemv_rows: int = 2

    def __post_init__(self) -> None:
        if not 0 <= self.gemv_rows <= GEMV_MAX_ROWS:
            raise ValueError(f"fused gemv_rows must be 0, 1 or 2, got {self.gemv_rows}")

    @property
    def prefetch_bytes(self) -> int:
        return self.prefetch_kib << 10


@dataclass(frozen=True)
class ExperimentalOptions:
    """Alternative implementations of the same step, for benchmarks and tests; defaults serve."""

    attention_kernel: bool = True  # talker decode attention through the Triton kernel (CUDA only)
    compile_elementwise: bool = False  # torch.compile the norms / RoPE / SwiGLU act (fused_ops.py)
    # decode work on the fused Triton kernels (fused_decode.py): None = on CUDA; True also on the CPU
    # (needs TRITON_INTERPRET=1: tests); False = the unfused layers
    fused_kernels: bool | None = None
    fused: FusedSettings = field(default_factory=FusedSettings)
    # the codec's SnakeBeta activations, RMS norms and SwiGLU activations on their Triton kernels
    # (kernels/snake.py, kernels/fused_linear.py's row kernels): None = on CUDA; False = torch ops
    codec_kernels: bool | None = None


@dataclass(frozen=True)
class ServeOptions:
    """Serving knobs of one model instance."""

    max_slots: int = 16  # streams held at once (KV + codec state rows)
    max_batch_size: int = 16  # slots per generate() call
    max_seq_len: int = 1536  # talker positions per slot: prompt (~10) + one per frame (~2 min of audio)
    codec_mode: str = "stateful"  # "stateful" | "windowed" (stateless re-decode, the reference path)
    windowed_left_context: int = 72  # frames re-decoded before each chunk in windowed mode
    random_frames_per_token: float = 3.0  # random weights: frames per text token when not forced
    cuda_graphs: bool = True  # capture the frame step and the codec per bucket (CUDA only)
    decode_buckets: tuple[int, ...] = ()  # batch sizes with a decode graph; () = powers of 2 + 3/4 steps
    max_prefill_batch: int = 32  # new streams prefilled together: a step's new ones in calls of this many
    prefill_len_buckets: tuple[int, ...] = (16, 32, 64)  # longer prompts prefill eagerly
    codec_batch_buckets: tuple[int, ...] = ()  # () = powers of 2 up to max_batch_size
    # codec graphs for 1, 2, 4, 8 ... up to this many frames; a tick's chunks are padded to the
    # smallest that fits the longest; a longer chunk runs eagerly at its own length
    codec_graph_frames: int = 12
    # cuDNN times its conv algorithms while the codec graphs are captured (CUDA graphs only): 1.5-1.9x
    # faster codec calls, for ~30-40 s more start-up on the H200 (docs/performance-history.md)
    codec_cudnn_benchmark: bool = True
    experimental: ExperimentalOptions = field(default_factory=ExperimentalOptions)

    def __post_init__(self) -> None:
        if self.codec_mode not in CODEC_MODES:
            raise ValueError(f"codec_mode must be one of {CODEC_MODES}, got {self.codec_mode!r}")
        if not 1 <= self.max_batch_size <= self.max_slots:
            raise ValueError("need 1 <= max_batch_size <= max_slots")
        if self.max_seq_len < 16:
            raise ValueError("max_seq_len must be >= 16 (a prompt is about 12 positions)")
        if self.max_seq_len < 32:
            raise ValueError("max_seq_len must be >= 32")


# --- slots sized from free GPU memory (``max_slots="auto"``) ---------------------------------------
AUTO_MAX_SLOTS = 512  # the most slots "auto" gives: past this one worker's frame step is the limit
AUTO_SLOTS_CPU = 16  # "auto" off CUDA: a CPU runs a few real-time streams, not hundreds
# Free memory "auto" leaves unclaimed for what does not scale with slots: activations of a
# max_batch_size step, the CUDA-graph pools (one per bucket), cuDNN's conv workspaces, the codec's
# 64 x 12-frame batch (~0.3 GB per activation at the last stage). The larger of the two.
HEADROOM_FRACTION = 0.15
MIN_HEADROOM_BYTES = 6 << 30


@dataclass(frozen=True)
class SlotBytes:
    """Device bytes one slot holds for its whole life (kv_cache.py, codec_state.py, slot_state.py)."""

    kv: int  # K and V rows of every talker layer: 2 x layers x kv_heads x max_seq_len x head_dim x elem
    codec_state: int  # the decoder's flat state row (state_width x elem) + its int64 frame position
    slot_state: int  # text queue (max_seq_len int64), repetition history (vocab bools), sampling rows

    @property
    def total(self) -> int:
        return self.kv + self.codec_state + self.slot_state


def slot_bytes(
    *,
    num_layers: int,
    kv_heads: int,
    head_dim: int,
    max_seq_len: int,
    elem_bytes: int,
    codec_state_width: int,
    codec_elem_bytes: int,
    talker_vocab: int,
) -> SlotBytes:
    return SlotBytes(
        kv=2 * num_layers * kv_heads * max_seq_len * head_dim * elem_bytes,
        codec_state=codec_state_width * codec_elem_bytes + 8,
        # text + seen + (last codes, positions, seed ... : 32 int64 or float32 words at most)
        slot_state=8 * max_seq_len + talker_vocab + 32 * 8,
    )


def slots_from_memory(
    free_bytes: int,
    total_bytes: int,
    per_slot: SlotBytes,
    *,
    own_bytes: int = 0,
    share: float = 1.0,
    cap: int = AUTO_MAX_SLOTS,
) -> int:
    """Slots that fit on a device of ``total_bytes`` with ``free_bytes`` free now, at most ``cap``;
    0 when not even one fits.

    ``share``: this process's part of the device (1/2 for one of two engine cores on one GPU).
    Cores on one device start together, so what one sees free depends on whether the other has
    allocated yet; the budget is therefore ``share`` of the device less what this process holds
    already (``own_bytes``: its weights), never more than is free, less its share of the headroom.
    One row more than the slots is allocated (the graphs' padding slot), so it is paid for here.
    """
    if not 0.0 < share <= 1.0:
        raise ValueError(f"share must be within (0, 1], got {share}")
    headroom = share * max(MIN_HEADROOM_BYTES, HEADROOM_FRACTION * total_bytes)
    budget = min(free_bytes, share * total_bytes - own_bytes) - headroom
    fit = int(budget // per_slot.total) - 1
    return max(0, min(cap, fit))
