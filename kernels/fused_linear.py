"""A decode-shaped linear layer with its neighbours fused in: RMS norm before, bias / SwiGLU / residual after.

The frame step of Qwen3-TTS runs 103 decoder-layer forwards per frame (28 talker + 15 passes x 5 code
predictor) on a handful of rows each. Every layer is four linears (q|k|v, o, gate|up, down) plus the
glue around them (two RMS norms, the SwiGLU activation, two residual adds); launched separately, the glue
doubles the kernel count, and at these sizes each kernel costs a few microseconds of launch and ramp
whatever it computes. One kernel here does

    y = epilogue( prologue(x) @ W^T )         x (M, K), W (N or 2N, K), y (M, N)

    prologue  HAS_NORM   x -> rms_norm(x) * g                 (the layer's input / post-attention norm)
    epilogue  HAS_BIAS   + b
              ACT = 1    silu(y)                               (the talker's text projection)
              ACT = 2    silu(x @ Wg^T) * (x @ Wu^T)           (W = gate|up stacked: rows [0, N) and [N, 2N))
              HAS_RES    residual + y                          (o_proj and down_proj)

Rounding follows the unfused reference step by step (the normed row is rounded to the input dtype, then
scaled by g and rounded again; the projection is rounded before the bias / activation / residual), so
the fused and unfused models agree to the last bit in fp32 and to bf16 rounding noise in bf16.

Two kernels, one launcher (``fused_linear``):

* tiled (3 rows and more): grid (cdiv(N, BLOCK_N), cdiv(M, BLOCK_M)). A program owns BLOCK_N output
  columns of BLOCK_M rows. With a norm it first walks its rows of x once for the sum of squares (x is a
  few KB and sits in L2: every program re-reading it costs far less than a separate norm kernel's
  launch), then walks K in BLOCK_K tiles: x tile (normed and scaled on the fly) . W tile^T with tl.dot,
  fp32 accumulation. The weights are streamed exactly once per row block; at decode sizes (M <= 64)
  the kernel is bound by reading W, and the tiles are chosen so that there are enough programs to keep
  every SM streaming.
* one or two rows (the B = 1 frame step): kernels/gemv.py, which loads its weights into registers
  before the programmatic-dependent-launch wait.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from voicewire.kernels.gemv import GEMV_MAX_ROWS, GemvConfig, gemv_config, launch_gemv
from voicewire.kernels.launch_checks import (
    INTERPRETER_BLOCK_N,
    MIN_DOT_DIM,
    SUPPORTED_DTYPES,
    check_same_device_unit_stride,
    interpreter_enabled,
)
from voicewire.kernels.linear_epilogue import ACT_NONE, ACT_SILU, ACT_SILU_MUL, epilogue
from voicewire.kernels.pdl import pdl_enter, pdl_launch, prefetch_l2, prefetch_ok

# Rows per program: tl.dot needs >= 16; above 64 the x tile and the accumulator crowd the registers,
# so larger batches take several row blocks (each re-reads W: 2x the bytes at M = 128).
MAX_BLOCK_M = 64
# Programs per launch below which a wider band leaves SMs idle (132 SMs on the H200; 96 measured best
# for the 3072-wide heads and gate|up bands, which stream two tiles per step).
PROGRAMS_WANTED = 96
# Shared memory a launch may plan for: the H200's 227 KiB per block, less 4 KiB for Triton's own scratch
# (gate|up at 64-wide bands, 3 stages: 216 KiB, ran; the hardware limit is 232,448 bytes).
SHARED_MEMORY_BYTES = 223 * 1024


@dataclass(frozen=True)
class LinearConfig:
    """Tile shape of one launch; ``linear_config`` picks it, tests and the benchmark may override it."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 4


def linear_config(m: int, n: int, k: int, act: int = ACT_NONE) -> LinearConfig:
    """Tiles for an (m x k) . (k x n) decode GEMM (n = output columns; gate|up counts its N, not 2N).

    Tuned on the H200 at the 1.7B shapes, M = 1 (benchmarks/linear_bench.py; the sweeps
    are in docs/performance-history.md): at decode sizes the time is reading W, and what
    matters is bytes in flight per SM. The widest band (BLOCK_N, at most 32 for gate|up) that still
    gives >= PROGRAMS_WANTED programs; 512-deep K steps where K >= 2048 (256 for gate|up, which streams two bands per step);
    3 stages (5 for the 16-wide bands, whose stages are small); then cut to what shared memory holds.
    """
    block_m = max(MIN_DOT_DIM, min(MAX_BLOCK_M, triton.next_power_of_2(m)))
    block_n = MIN_DOT_DIM
    # gate|up streams two bands per step: 64-wide bands (6 x 64 KiB stages) leave room for only 2
    # stages, and at M = 1 its 32-wide bands ran 18.1 us against 22.5 (talker; docs/performance-history.md)
    for bn in (32,) if act == ACT_SILU_MUL else (32, 64):
        if n >= PROGRAMS_WANTED * bn:
            block_n = bn
    if interpreter_enabled():
        block_n = INTERPRETER_BLOCK_N
    block_n = min(block_n, max(MIN_DOT_DIM, triton.next_power_of_2(n)))
    deep = 512 if k >= 2048 and act != ACT_SILU_MUL else 256
    block_k = min(deep, max(MIN_DOT_DIM, triton.next_power_of_2(k)))
    return LinearConfig(block_m, block_n, block_k, 4, 5 if block_n == MIN_DOT_DIM else 3)


def fit_shared_memory(cfg: LinearConfig, act: int, element_bytes: int) -> LinearConfig:
    """Fewer pipeline stages (then shallower K steps) until the tiles fit in shared memory."""
    tiles = 3 if act == ACT_SILU_MUL else 2  # x, W (and W_up) tiles per stage

    def stage_bytes(c: LinearConfig) -> int:
        return (c.block_m * c.block_k + (tiles - 1) * c.block_k * c.block_n) * element_bytes

    while cfg.num_stages > 2 and stage_bytes(cfg) * cfg.num_stages > SHARED_MEMORY_BYTES:
        cfg = replace(cfg, num_stages=cfg.num_stages - 1)
    while cfg.block_k > MIN_DOT_DIM and stage_bytes(cfg) * cfg.num_stages > SHARED_MEMORY_BYTES:
        cfg = replace(cfg, block_k=cfg.block_k // 2)
    return cfg


@triton.jit
def _fused_linear_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    norm_ptr,
    bias_ptr,
    res_ptr,
    index_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_om,
    stride_rm,
    eps,
    prefetch_elements,
    HAS_NORM: tl.constexpr,
    ACT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_RES: tl.constexpr,
    HAS_INDEX: tl.constexpr,
    EVEN_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    USE_PDL: tl.constexpr,
    PREFETCH: tl.constexpr,
    PREFETCH_PIECES: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    if PREFETCH:  # noqa: SIM102 (a constexpr branch: compiled out when off)
        # PDL: while the previous kernel runs, pull the head of this program's weight band(s) into L2
        if pid_m == 0:
            band = w_ptr + pid_n * BLOCK_N * stride_wn  # BLOCK_N contiguous rows of W
            count = tl.minimum(tl.minimum(BLOCK_N, N - pid_n * BLOCK_N) * stride_wn, prefetch_elements)
            prefetch_l2(band, count, PREFETCH_PIECES)
            if ACT == 2:
                prefetch_l2(band + N * stride_wn, count, PREFETCH_PIECES)
    pdl_enter(USE_PDL)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok = rm < M
    n_ok = rn < N
    dtype = x_ptr.dtype.element_ty
    if HAS_INDEX:  # row m of x is row index[m] of the table x_ptr (an embedding lookup)
        x_rows = x_ptr + tl.load(index_ptr + rm, mask=m_ok, other=0).to(tl.int64)[:, None] * stride_xm
    else:
        x_rows = x_ptr + rm[:, None] * stride_xm  # (BM, 1)
    w_cols = w_ptr + rn[None, :] * stride_wn  # (1, BN): W^T tiles are (BK, BN)

    if HAS_NORM:
        sum_sq = tl.zeros([BLOCK_M], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + rk
            xs = tl.load(x_rows + kk[None, :], mask=m_ok[:, None] & (kk < K)[None, :], other=0.0)
            xs = xs.to(tl.float32)
            sum_sq += tl.sum(xs * xs, axis=1)
        rstd = tl.math.rsqrt(sum_sq / K + eps)

    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)  # ACT_SILU_MUL only; dead code otherwise
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        if EVEN_K:
            xk = tl.load(x_rows + kk[None, :], mask=m_ok[:, None], other=0.0)
            w = tl.load(w_cols + kk[:, None], mask=n_ok[None, :], other=0.0)
        else:
            k_ok = kk < K
            xk = tl.load(x_rows + kk[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(w_cols + kk[:, None], mask=n_ok[None, :] & k_ok[:, None], other=0.0)
        if HAS_NORM:
            g = tl.load(norm_ptr + kk, mask=kk < K, other=0.0).to(tl.float32)
            xn = (xk.to(tl.float32) * rstd[:, None]).to(dtype)
            xk = (xn.to(tl.float32) * g[None, :]).to(dtype)
        acc = tl.dot(xk, w, acc, input_precision=DOT_PRECISION)
        if ACT == 2:
            if EVEN_K:
                wu = tl.load(w_cols + N * stride_wn + kk[:, None], mask=n_ok[None, :], other=0.0)
            else:
                wu = tl.load(
                    w_cols + N * stride_wn + kk[:, None],
                    mask=n_ok[None, :] & (kk < K)[:, None],
                    other=0.0,
                )
            acc_up = tl.dot(xk, wu, acc_up, input_precision=DOT_PRECISION)

    mask = m_ok[:, None] & n_ok[None, :]
    bias = tl.load(bias_ptr + rn, mask=n_ok, other=0.0)[None, :] if HAS_BIAS else 0.0
    res_ptrs = res_ptr + rm[:, None] * stride_rm + rn[None, :]
    out_ptrs = out_ptr + rm[:, None] * stride_om + rn[None, :]
    epilogue(acc, acc_up, bias, x_ptr, res_ptrs, out_ptrs, mask, ACT, HAS_BIAS, HAS_RES)


@triton.jit
def _rms_norm_kernel(
    x_ptr, w_ptr, out_ptr, K, stride_xm, stride_om, eps, BLOCK_K: tl.constexpr, USE_PDL: tl.constexpr
):
    pdl_enter(USE_PDL)
    m = tl.program_id(0)
    k = tl.arange(0, BLOCK_K)
    ok = k < K
    x = tl.load(x_ptr + m * stride_xm + k, mask=ok, other=0.0)
    xf = x.to(tl.float32)
    rstd = tl.math.rsqrt(tl.sum(xf * xf, axis=0) / K + eps)
    y = (xf * rstd).to(x.dtype).to(tl.float32) * tl.load(w_ptr + k, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + m * stride_om + k, y.to(x.dtype), mask=ok)


@triton.jit
def _silu_mul_kernel(x_ptr, out_ptr, F, stride_xm, stride_om, BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
    pdl_enter(USE_PDL)
    m = tl.program_id(0)
    f = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = f < F
    gate = tl.load(x_ptr + m * stride_xm + f, mask=ok, other=0.0)
    up = tl.load(x_ptr + m * stride_xm + F + f, mask=ok, other=0.0).to(tl.float32)
    g = gate.to(tl.float32)
    s = (g / (1.0 + tl.exp(-g))).to(gate.dtype).to(tl.float32)
    tl.store(out_ptr + m * stride_om + f, (s * up).to(gate.dtype), mask=ok)


def silu_mul_rows(gate_up: torch.Tensor, *, pdl: bool = False) -> torch.Tensor:
    """(M, 2F) gate|up -> silu(gate) * up (M, F), rounded as the unfused ops round."""
    if gate_up.dim() != 2 or gate_up.shape[1] % 2:
        raise ValueError(f"gate_up must be (M, 2F), got {tuple(gate_up.shape)}")
    m, f = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty((m, f), device=gate_up.device, dtype=gate_up.dtype)
    check_same_device_unit_stride({"gate_up": gate_up, "out": out}, gate_up.device)
    if m:
        block = min(1024, triton.next_power_of_2(f))
        _silu_mul_kernel[(m, triton.cdiv(f, block))](
            gate_up,
            out,
            f,
            gate_up.stride(0),
            out.stride(0),
            BLOCK=block,
            num_warps=4,
            **pdl_launch(pdl, gate_up.device),
        )
    return out


def rms_norm_rows(x: torch.Tensor, weight: torch.Tensor, eps: float, *, pdl: bool = False) -> torch.Tensor:
    """rms_norm(x) * weight for x (M, K), one program per row (the talker's final norm)."""
    if x.dim() != 2 or weight.shape != (x.shape[1],) or weight.dtype != x.dtype:
        raise ValueError(
            f"x must be (M, K) and weight (K,) of x's dtype, got {tuple(x.shape)}, {tuple(weight.shape)}"
        )
    out = torch.empty_like(x)
    check_same_device_unit_stride({"x": x, "weight": weight, "out": out}, x.device)
    if x.shape[0]:
        _rms_norm_kernel[(x.shape[0],)](
            x,
            weight,
            out,
            x.shape[1],
            x.stride(0),
            out.stride(0),
            eps,
            BLOCK_K=triton.next_power_of_2(x.shape[1]),
            num_warps=4,
            **pdl_launch(pdl, x.device),
        )
    return out


def fused_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    bias: torch.Tensor | None = None,
    act: int = ACT_NONE,
    residual: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    index: torch.Tensor | None = None,
    pdl: bool = False,
    prefetch_bytes: int = 0,
    gemv_rows: int = GEMV_MAX_ROWS,
    config: LinearConfig | GemvConfig | None = None,
) -> torch.Tensor:
    """y = epilogue(prologue(x) @ W^T) for x (M, K) (any row stride, unit column stride).

    weight (N, K), or (2N, K) gate|up rows for ``act=ACT_SILU_MUL``; norm_weight (K,); bias (N,);
    residual (M, N). Returns (M, N) in ``out_dtype`` (default x's dtype; the value is always rounded to
    x's dtype first, as an unfused bf16 linear would be), written into ``out`` when given.

    ``index`` (M,) int32/int64: x is a table and row m of the input is ``x[index[m]]`` (an embedding
    lookup folded in; indices are not bounds-checked: the kernel runs inside CUDA graphs).
    ``pdl``: launch with programmatic dependent launch where the device has it (kernels/pdl.py), and
    prefetch up to ``prefetch_bytes`` of each program's weight band into L2 before the wait.
    Up to ``gemv_rows`` rows (at most GEMV_MAX_ROWS; 0: never) run on the one-/two-row kernel, which
    also loads the head of its band into registers before the wait; a ``config`` picks the kernel too.
    """
    if x.dim() != 2 or weight.dim() != 2:
        raise ValueError(
            f"x must be (M, K) and weight (N, K), got {tuple(x.shape)} and {tuple(weight.shape)}"
        )
    m, k = x.shape
    if index is not None:
        if index.dim() != 1 or index.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"index must be 1-D int32 or int64, got {index.dtype} {tuple(index.shape)}")
        m = index.shape[0]
    rows, k_w = weight.shape
    if k_w != k:
        raise ValueError(f"x has {k} columns but weight has {k_w}")
    if act not in (ACT_NONE, ACT_SILU, ACT_SILU_MUL):
        raise ValueError(f"unknown act {act}")
    if act == ACT_SILU_MUL and rows % 2:
        raise ValueError(f"gate|up weight needs an even number of rows, got {rows}")
    n = rows // 2 if act == ACT_SILU_MUL else rows
    if x.dtype not in SUPPORTED_DTYPES or weight.dtype != x.dtype:
        raise TypeError(
            f"x and weight must share one of {SUPPORTED_DTYPES}, got {x.dtype} and {weight.dtype}"
        )
    tensors = {"x": x, "weight": weight}
    for name, t, shape in (
        ("norm_weight", norm_weight, (k,)),
        ("bias", bias, (n,)),
        ("residual", residual, (m, n)),
    ):
        if t is not None:
            if tuple(t.shape) != shape:
                raise ValueError(f"{name} must be {shape}, got {tuple(t.shape)}")
            tensors[name] = t
    if out is None:
        out = torch.empty((m, n), device=x.device, dtype=out_dtype or x.dtype)
    elif tuple(out.shape) != (m, n):
        raise ValueError(f"out must be {(m, n)}, got {tuple(out.shape)}")
    tensors["out"] = out
    if index is not None:
        tensors["index"] = index
    check_same_device_unit_stride(tensors, x.device)
    if m == 0:
        return out
    launch = pdl_launch(pdl, x.device)
    prefetch = launch["USE_PDL"] and prefetch_bytes > 0 and prefetch_ok(weight)
    common = (
        x,
        weight,
        out,
        norm_weight if norm_weight is not None else x,
        bias if bias is not None else x,
        residual if residual is not None else x,
        index if index is not None else x,
    )
    flags = {
        "HAS_NORM": norm_weight is not None,
        "ACT": act,
        "HAS_BIAS": bias is not None,
        "HAS_RES": residual is not None,
        "HAS_INDEX": index is not None,
        "PREFETCH": prefetch,
        **launch,
    }
    strides = (
        x.stride(0),
        weight.stride(0),
        out.stride(0),
        residual.stride(0) if residual is not None else 0,
    )
    prefetch_elements = prefetch_bytes // weight.element_size()
    gemv = isinstance(config, GemvConfig) or (config is None and m <= min(gemv_rows, GEMV_MAX_ROWS))
    if gemv:
        if m > GEMV_MAX_ROWS:
            raise ValueError(f"the one-/two-row kernel takes at most {GEMV_MAX_ROWS} rows, got {m}")
        g = config if isinstance(config, GemvConfig) else gemv_config(n, k)
        launch_gemv(common, n, k, strides, eps, prefetch_elements, m == 2, g, flags)
        return out
    tiled = config if isinstance(config, LinearConfig) else linear_config(m, n, k, act)
    cfg = fit_shared_memory(tiled, act, x.element_size())
    grid = (triton.cdiv(n, cfg.block_n), triton.cdiv(m, cfg.block_m))
    _fused_linear_kernel[grid](
        *common,
        m,
        n,
        k,
        *strides,
        eps,
        prefetch_elements,
        EVEN_K=k % cfg.block_k == 0,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        PREFETCH_PIECES=32 * cfg.num_warps,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        **flags,
    )
    return out


__all__ = [
    "ACT_NONE",
    "ACT_SILU",
    "ACT_SILU_MUL",
    "LinearConfig",
    "fused_linear",
    "linear_config",
    "rms_norm_rows",
    "silu_mul_rows",
]
