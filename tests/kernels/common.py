"""Helpers shared by the kernel tests (imported after conftest.py has set TRITON_INTERPRET)."""

from __future__ import annotations

import os

import pytest
import torch

from voicewire.engine.qwen3.codec_decoder import CodecDecoder
from voicewire.engine.qwen3.presets import preset

# CPU tensors reach a kernel only through the Triton interpreter (enabled by conftest.py without CUDA)
needs_interpreter = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET", "0") in ("", "0"),
    reason="CPU cases need the Triton interpreter (only enabled without CUDA)",
)
DEVICES = [pytest.param("cpu", marks=needs_interpreter), pytest.param("cuda", marks=pytest.mark.gpu)]

# ‖out - ref‖ / ‖ref‖ bounds against fp32 references: fp32 dots in IEEE mode land near 1e-7; fp16 and
# bf16 round P to 10 and 7 mantissa bits before P @ V (seen: ~5e-5 fp16 here; bf16 ~4e-3 typical).
REL_TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.5e-2}


def skip_unsupported(device: str, dtype: torch.dtype) -> None:
    """Triton 3.9's interpreter multiplies bf16 operands of tl.dot as raw uint16 bit patterns, so bf16 is
    only checked compiled, on the GPU."""
    if device == "cpu" and dtype == torch.bfloat16:
        pytest.skip("the Triton interpreter's tl.dot does not handle bf16")


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert torch.isfinite(out).all(), "kernel output has NaN/inf: an unwritten or poisoned entry leaked"
    return float((out.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30))


def tiny_codec(device: str, frames: int) -> tuple[CodecDecoder, torch.Tensor]:
    """The tiny preset's codec decoder with random weights (large enough that every layer counts) on
    ``device``, unprepared, and random codes (2, 16, frames) for it."""
    torch.manual_seed(0)
    codec = CodecDecoder(preset("tiny").codec).to(device)
    with torch.no_grad():
        for p in codec.parameters():
            p.normal_(0, 0.05)
    codes = torch.randint(0, codec.cfg.codebook_size, (2, codec.cfg.num_quantizers, frames), device=device)
    return codec, codes
