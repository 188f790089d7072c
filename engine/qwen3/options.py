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
    # codec SnakeBeta activations on the one-pass Triton kernel (kernels/snake.py): None = on CUDA
    codec_snake_kernel: bool | None = None


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
    max_prefill_batch: int = 8  # new streams prefilled together (one graph call); more wait a step
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
