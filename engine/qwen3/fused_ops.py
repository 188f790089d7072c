"""torch.compile'd versions of the elementwise pieces of a decoder layer (CUDA only, opt-in).

Eager, one RMS norm is ~7 kernels (cast, square, mean, add, rsqrt, mul, cast, scale) and one RoPE
rotation ~5; a layer runs four norms and two rotations, so the 103 layer-forwards of a frame step
(28 talker + 15 x 5 code predictor) launch ~4,300 of these tiny kernels. Inductor fuses each function
into one Triton kernel. Compiled with ``dynamic=True`` so one compilation serves every batch bucket;
the result is called inside our own CUDA graphs (cuda_graphs.py), not inductor's.

Measured against eager + graphs with benchmarks/serving_bench.py (step variant ``compile``); the
numbers are in docs/performance-history.md.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torch import nn

from .frame_step import FrameStep
from .layers import Attention, RMSNorm, SwiGLU, rms_norm, silu_mul
from .rope import rotate
from .sampler import sample

# Each function meets several rank / size-1 specializations (talker and predictor widths, q and k
# heads, decode and prefill shapes, batch 1): more than dynamo's default cache of 8 per function.
COMPILE_CACHE_SIZE = 64


def _compiled(fn: Any) -> Any:
    import torch._dynamo

    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, COMPILE_CACHE_SIZE)
    return torch.compile(fn, dynamic=True, fullgraph=True)


def compile_elementwise(modules: Iterable[nn.Module]) -> None:
    """Point every RMSNorm / Attention rotation / SwiGLU activation under ``modules`` at compiled code."""
    norm, rot, act = _compiled(rms_norm), _compiled(rotate), _compiled(silu_mul)
    for root in modules:
        for m in root.modules():
            if isinstance(m, RMSNorm):
                m.fn = norm
            elif isinstance(m, Attention):
                m.rotate = rot
            elif isinstance(m, SwiGLU):
                m.act = act


def compile_sampler(step: FrameStep) -> None:
    """The sampler's ~30 elementwise ops per codebook (hash noise, masks, softmax) fused; 16 per step."""
    step.sample = _compiled(sample)


__all__ = ["compile_elementwise", "compile_sampler"]
