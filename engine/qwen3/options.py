"""Serving options of one Qwen3-TTS model instance (not part of the checkpoint).

``ServeOptions`` holds what a user sizes and tunes a deployment with. ``ExperimentalOptions``
holds the switches that pick another implementation of the same computation (the unfused layers,
torch.compile, the torch SnakeBeta, the fused path's launch variants): they exist so the
benchmarks can measure the alternatives and the tests can compare them; the defaults are what
serves, and the measurements behind them are in docs/performance-history.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .kv_pool import NEW_STREAM_POSITIONS, PAGE, blocks_for

CODEC_MODES = ("stateful", "windowed")
GEMV_MAX_ROWS = 2  # kernels/gemv.py's GEMV_MAX_ROWS: the most rows its one-/two-row kernel takes


@dataclass(frozen=True)
class FusedSettings:
    """How the fused decode path runs (fused_decode.py)."""

    # batches above this many rows run the wide projections on norm + cuBLAS + SwiGLU
    cublas_rows: int = 8
    # and above this many, o and down too (cuBLAS, the residual added in its epilogue); below, the fused
    # epilogue. 1.7B frame step on the H200, the add then a launch of its own: at 128 rows the fused
    # epilogue won (7.0 against 7.6 ms), at 256 cuBLAS (9.2 against 12.0 ms) and at 512 (13.6 against 20.4)
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
    # the codec's convs of k > 1 on kernels/conv1d.py (one compiled kernel for every length, kept in
    # the compile cache) instead of cuDNN's algorithms, which torch times per graph shape at every
    # start (most of a start's graph warm-up): None = on CUDA. Codec calls of fewer rows x frames than
    # codec_conv_kernel_min_frames keep cuDNN: a lone stream's one- and two-frame first chunks, which
    # its timed algorithms run up to 18% faster than the kernel (1 x 1). Not more: on a slow host its
    # timing took 4-7 s of warm-up for each of the slowest graphs (8-24 rows x frames), the kernel's
    # about 1 s, and such calls run within 10% on either (startup_1.7b_tip7_h100.json,
    # codec_conv_kernel_h100.json)
    codec_conv_kernel: bool | None = None
    codec_conv_kernel_min_frames: int = 4
    # positions per KV block; 0 = kv_pool.PAGE. ServeOptions.max_seq_len is the slot-contiguous layout
    # (one page per stream), the reference the paged cache is tested against
    kv_page: int = 0
    # graph warm-up at start-up (cuda_graphs.py capture): the talker's graphs (Triton compiling) on
    # warm_threads threads, the codec's (cuDNN timing its convs) on codec_warm_threads beside them;
    # warm_threads 0 = all on one
    warm_threads: int = 4
    codec_warm_threads: int = 4


@dataclass(frozen=True)
class ServeOptions:
    """Serving knobs of one model instance."""

    max_slots: int = 16  # streams held at once (KV + codec state rows)
    max_batch_size: int = 16  # slots per generate() call
    max_seq_len: int = 1536  # talker positions per stream at most: prompt (~10) + one per frame (~2 min)
    # KV blocks of kv_pool.PAGE positions in the pool, the scratch block included; 0 = enough for
    # every slot at max_seq_len (never full). load_qwen3(max_slots="auto") sizes it from free memory.
    kv_blocks: int = 0
    codec_mode: str = "stateful"  # "stateful" | "windowed" (stateless re-decode, the reference path)
    windowed_left_context: int = 72  # frames re-decoded before each chunk in windowed mode
    random_frames_per_token: float = 3.0  # random weights: frames per text token when not forced
    cuda_graphs: bool = True  # capture the frame step and the codec per bucket (CUDA only)
    decode_buckets: tuple[int, ...] = ()  # batch sizes with a decode graph; () = powers of 2 + 3/4 steps
    max_prefill_batch: int = 32  # new streams prefilled together: a step's new ones in calls of this many
    prefill_len_buckets: tuple[int, ...] = (16, 32, 64)  # longer prompts prefill eagerly
    # prompt heads (voice, language, instruction) whose KV is kept on the device, so a stream of one
    # of them starts without a prefill (prefix_cache.py); 0: every stream prefills
    prefix_cache: int = 32
    codec_batch_buckets: tuple[int, ...] = ()  # () = powers of 2 up to max_batch_size
    # codec graphs for 1, 2, 4, 8 ... up to this many frames; a tick's chunks are padded to the
    # smallest that fits the longest; a longer chunk runs eagerly at its own length
    codec_graph_frames: int = 12
    # cuDNN times its conv algorithms while the codec graphs are captured (CUDA graphs only): 1.5-1.9x
    # faster codec calls; the timing is most of start-up on the H200 (~58 s, beside the talker's)
    codec_cudnn_benchmark: bool = True
    # the conv algorithms cuDNN times per shape, best ranked first (torch.backends.cudnn.benchmark_limit):
    # on the H200 3 picks what 10 does at every shape (codec_cudnn_limit_h200.json) in half the time
    codec_cudnn_limit: int = 3
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
        if self.kv_blocks and self.kv_blocks < 2:
            raise ValueError("kv_blocks must be 0 (one full row per slot) or >= 2 (scratch + one)")
        if self.kv_page % PAGE and self.kv_page < self.max_seq_len:  # a key tile must lie in one page
            raise ValueError(f"kv_page must be a multiple of {PAGE} or >= max_seq_len, got {self.kv_page}")

    @property
    def kv_page(self) -> int:
        return self.experimental.kv_page or PAGE

    @property
    def pool_blocks(self) -> int:
        """The KV pool's blocks, the scratch block included (``kv_blocks``, or one full row per slot)."""
        return self.kv_blocks or 1 + self.max_slots * blocks_for(self.max_seq_len, self.kv_page)


def default_decode_buckets(limit: int) -> tuple[int, ...]:
    """1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96 ...: a padded bucket runs at most 1/3 empty rows
    (``ServeOptions.decode_buckets`` when it is ())."""
    out = [b for b in (1, 2, 4, 8) if b < limit]
    b = 8
    while b < limit:
        b += max(4, 1 << (b.bit_length() - 2))
        out.append(min(b, limit))
    if not out or out[-1] != limit:
        out.append(limit)
    return tuple(sorted(set(out)))


# --- slots and KV blocks sized from free GPU memory (``max_slots="auto"``) ---------------------------
# The most slots "auto" gives. A slot's own state is small (the codec's state row, ~0.8 MB on the 1.7B,
# and its text / sampling rows; its KV comes from the block pool as it speaks), so the bound is the
# worker's frame step rather than memory: 2,048 streams at 12.5 frames/s are 256-row steps every 10 ms.
AUTO_MAX_SLOTS = 2048
AUTO_SLOTS_CPU = 16  # "auto" off CUDA: a CPU runs a few real-time streams, not hundreds
# Free memory "auto" leaves unclaimed for what does not scale with slots: activations of a
# max_batch_size step, the CUDA-graph pools (one per bucket), cuDNN's conv workspaces, the codec's
# 64 x 12-frame batch (~0.3 GB per activation at the last stage). The larger of the two.
HEADROOM_FRACTION = 0.15
MIN_HEADROOM_BYTES = 6 << 30


@dataclass(frozen=True)
class SlotBytes:
    """Device bytes one slot holds for its whole life, its KV aside (codec_state.py, slot_state.py)."""

    codec_state: int  # the decoder's flat state row (state_width x elem) + its int64 frame position
    slot_state: int  # text queue (max_seq_len int64), repetition history (vocab bools), sampling rows

    @property
    def total(self) -> int:
        return self.codec_state + self.slot_state


def slot_bytes(
    *, max_seq_len: int, codec_state_width: int, codec_elem_bytes: int, talker_vocab: int
) -> SlotBytes:
    return SlotBytes(
        codec_state=codec_state_width * codec_elem_bytes + 8,
        # text + seen + (last codes, positions, seed ... : 32 int64 or float32 words at most)
        slot_state=8 * max_seq_len + talker_vocab + 32 * 8,
    )


def block_bytes(*, num_layers: int, kv_heads: int, head_dim: int, elem_bytes: int) -> int:
    """K and V of one PAGE-position block in every talker layer (kv_cache.py)."""
    return 2 * num_layers * kv_heads * PAGE * head_dim * elem_bytes


@dataclass(frozen=True)
class PoolSize:
    """What ``pool_from_memory`` fits: stream slots and KV blocks (the scratch block included)."""

    slots: int
    blocks: int


def pool_from_memory(
    free_bytes: int,
    total_bytes: int,
    per_slot: SlotBytes,
    per_block: int,
    *,
    own_bytes: int = 0,
    share: float = 1.0,
    cap: int = AUTO_MAX_SLOTS,
) -> PoolSize:
    """Slots and KV blocks that fit on a device of ``total_bytes`` with ``free_bytes`` free now; 0 slots
    when not even one stream fits.

    Each slot must be able to get going (its own state and ``blocks_for(NEW_STREAM_POSITIONS)`` blocks):
    that bounds the slots, at most ``cap``. Everything left after the slots' state becomes blocks.

    ``share``: this process's part of the device (1/2 for one of two engine cores on one GPU).
    Cores on one device start together, so what one sees free depends on whether the other has
    allocated yet; the budget is therefore ``share`` of the device less what this process holds
    already (``own_bytes``: its weights), never more than is free, less its share of the headroom.
    One slot row more than the slots is allocated (the graphs' padding slot), and one block more
    (the scratch block), so both are paid for here.
    """
    if not 0.0 < share <= 1.0:
        raise ValueError(f"share must be within (0, 1], got {share}")
    headroom = share * max(MIN_HEADROOM_BYTES, HEADROOM_FRACTION * total_bytes)
    budget = int(min(free_bytes, share * total_bytes - own_bytes) - headroom) - per_block
    start = per_slot.total + blocks_for(NEW_STREAM_POSITIONS) * per_block
    slots = max(0, min(cap, budget // start - 1))
    if slots == 0:
        return PoolSize(0, 0)
    blocks = (budget - (slots + 1) * per_slot.total) // per_block
    return PoolSize(slots, 1 + blocks)
