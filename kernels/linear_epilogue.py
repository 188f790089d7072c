"""The tail both decode linears share (kernels/fused_linear.py's tiled kernel, kernels/gemv.py's one- and
two-row kernel): bias, the activation and the residual add, rounded as the unfused layers round."""

from __future__ import annotations

import triton
import triton.language as tl

ACT_NONE, ACT_SILU, ACT_SILU_MUL = 0, 1, 2


@triton.jit
def epilogue(
    acc,
    acc_up,
    bias,
    x_ptr,
    res_ptrs,
    out_ptrs,
    mask,
    ACT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_RES: tl.constexpr,
):
    """Both kernels' tail: acc (+ bias) rounded to x's dtype, then SiLU / SwiGLU / the residual add, each
    rounded as the unfused ops round, stored in out's dtype."""
    dtype = x_ptr.dtype.element_ty
    if HAS_BIAS:
        acc += bias.to(tl.float32)
    y = acc.to(dtype).to(tl.float32)
    if ACT == 1:
        y = (y / (1.0 + tl.exp(-y))).to(dtype).to(tl.float32)
    if ACT == 2:
        up = acc_up.to(dtype).to(tl.float32)
        y = (y / (1.0 + tl.exp(-y))).to(dtype).to(tl.float32)
        y = (y * up).to(dtype).to(tl.float32)
    if HAS_RES:
        res = tl.load(res_ptrs, mask=mask, other=0.0)
        y = (res.to(tl.float32) + y).to(dtype).to(tl.float32)
    tl.store(out_ptrs, y.to(out_ptrs.dtype.element_ty), mask=mask)


__all__ = ["ACT_NONE", "ACT_SILU", "ACT_SILU_MUL", "epilogue"]
