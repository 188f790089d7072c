"""Building blocks shared by the talker and the code predictor: a Qwen3 decoder layer.

Parameter names follow the official checkpoint (``self_attn.q_proj`` ...), so ``weights.py`` maps a
checkpoint onto these modules by prefix alone.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import CodePredictorConfig, TalkerConfig
from .rope import rotate


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMS norm computed in float32, scaled in the input dtype (as the reference does)."""
    xf = x.to(torch.float32)
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def silu_mul(gate_up: Tensor) -> Tensor:
    """(..., 2F) fused gate|up projection -> silu(gate) * up (..., F)."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


# The elementwise pieces one layer calls; fused_ops.py swaps in torch.compile'd versions of the same
# functions (eager: ~7 kernels per RMS norm, 5 per rotation; compiled: one each).
NormFn = Callable[[Tensor, Tensor, float], Tensor]
RotateFn = Callable[[Tensor, Tensor, Tensor], Tensor]
ActFn = Callable[[Tensor], Tensor]


class RMSNorm(nn.Module):
    """RMS norm computed in float32, scaled in the input dtype (as the reference does)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.fn: NormFn = rms_norm

    def forward(self, x: Tensor) -> Tensor:
        return self.fn(x, self.weight, self.eps)


class LayerScale(nn.Module):
    """A per-channel scale on a residual branch (the codec's encoder and decoder transformers). The
    decoder folds it into the projection that ends the branch (codec_transformer.py) and never
    applies it on its own."""

    def __init__(self, dim: int, init: float) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), init))

    def forward(self, x: Tensor) -> Tensor:
        return self.scale * x


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)
        self.gate_up: Tensor | None = None  # (2F, D) after fuse(): one GEMM instead of two
        self.act: ActFn = silu_mul

    def fuse(self) -> None:
        """gate|up as one weight; the two parameters become views of it (checkpoint names kept)."""
        self.gate_up = _fuse_weights(self.gate_proj, self.up_proj)

    def forward(self, x: Tensor) -> Tensor:
        if self.gate_up is not None:
            return self.down_proj(self.act(F.linear(x, self.gate_up)))
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def _fuse_weights(*modules: nn.Module) -> Tensor:
    """Concatenate bias-free nn.Linear weights along the output dim and re-point each one at its rows.

    No copy is kept: the originals are freed and the parameters become views of the fused tensor.
    """
    linears = [m for m in modules if isinstance(m, nn.Linear)]
    if len(linears) != len(modules):
        raise TypeError("only nn.Linear projections can be fused")
    weights = [lin.weight for lin in linears]
    fused = torch.cat([w.detach() for w in weights])
    row = 0
    for lin, w in zip(linears, weights, strict=True):
        n = w.shape[0]
        lin.weight = nn.Parameter(fused[row : row + n], requires_grad=False)
        row += n
    return fused


class KVStore(Protocol):
    """Where a layer's keys/values live. ``update`` stores the new ones and returns what to attend over."""

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """k, v: (B, Hkv, T, hd) new entries -> (B, Hkv, S, hd) keys/values for this step's attention."""
        ...


class SelfAttendingKV(ABC):
    """A KV store that runs the attention itself (a kernel reading the cache in place)."""

    @abstractmethod
    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """q (B, H, T, hd), new k/v (B, Hkv, T, hd): store k/v, return the attention output (B, H, T, hd)."""


class Attention(nn.Module):
    """Qwen3 GQA attention with per-head RMS norms on q and k, then RoPE."""

    def __init__(
        self, dim: int, heads: int, kv_heads: int, head_dim: int, eps: float, bias: bool, layer: int
    ) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim, self.layer = heads, kv_heads, head_dim, layer
        self.q_proj = nn.Linear(dim, heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(dim, kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(dim, kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(heads * head_dim, dim, bias=bias)
        self.q_norm = RMSNorm(head_dim, eps)
        self.k_norm = RMSNorm(head_dim, eps)
        self.qkv: Tensor | None = None  # ((H + 2 Hkv) hd, D) after fuse()
        self.rotate: RotateFn = rotate

    def fuse(self) -> None:
        """q|k|v as one weight (one GEMM instead of three); bias-free projections only (Qwen3)."""
        if self.q_proj.bias is None:
            self.qkv = _fuse_weights(self.q_proj, self.k_proj, self.v_proj)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, kv: KVStore, mask: Tensor | None) -> Tensor:
        """x (B, T, D); cos/sin (B, T, hd); mask (B, 1, T, S) bool, True = may attend; None = all."""
        b, t, _ = x.shape
        nq, nkv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        if self.qkv is not None:
            q_lin, k_lin, v_lin = F.linear(x, self.qkv).split((nq, nkv, nkv), dim=-1)
        else:
            q_lin, k_lin, v_lin = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = self.q_norm(q_lin.view(b, t, self.heads, self.head_dim)).transpose(1, 2)
        k = self.k_norm(k_lin.view(b, t, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = v_lin.view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = self.rotate(q, cos, sin), self.rotate(k, cos, sin)
        if isinstance(kv, SelfAttendingKV):
            out = kv.attend(self.layer, q, k, v)
        else:
            k_all, v_all = kv.update(self.layer, k, v)  # (B, Hkv, S, hd)
            out = F.scaled_dot_product_attention(
                q, k_all, v_all, attn_mask=mask, enable_gqa=self.heads != self.kv_heads
            )  # (B, H, T, hd)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, nq))


class DecoderLayer(nn.Module):
    """Pre-norm Qwen3 block: x + attn(norm(x)); x + mlp(norm(x))."""

    def __init__(
        self,
        dim: int,
        intermediate: int,
        heads: int,
        kv_heads: int,
        head_dim: int,
        eps: float,
        bias: bool,
        layer: int,
    ) -> None:
        super().__init__()
        self.self_attn = Attention(dim, heads, kv_heads, head_dim, eps, bias, layer)
        self.mlp = SwiGLU(dim, intermediate)
        self.input_layernorm = RMSNorm(dim, eps)
        self.post_attention_layernorm = RMSNorm(dim, eps)

    def fuse(self) -> None:
        self.self_attn.fuse()
        self.mlp.fuse()

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, kv: KVStore, mask: Tensor | None) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, kv, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


def decoder_layers(cfg: TalkerConfig | CodePredictorConfig) -> nn.ModuleList:
    """The talker's and the code predictor's stacks of Qwen3 blocks (same block, other sizes)."""
    return nn.ModuleList(
        DecoderLayer(
            cfg.hidden_size,
            cfg.intermediate_size,
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.rms_norm_eps,
            cfg.attention_bias,
            i,
        )
        for i in range(cfg.num_layers)
    )


class ContiguousKV:
    """A KV store for short-lived sequences (the code predictor's 17 positions per frame).

    (layers, B, Hkv, max_len, hd) buffers filled left to right; ``advance`` moves the write point.
    """

    def __init__(
        self,
        layers: int,
        batch: int,
        kv_heads: int,
        max_len: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.k = torch.empty(layers, batch, kv_heads, max_len, head_dim, dtype=dtype, device=device)
        self.v = torch.empty_like(self.k)
        self.start = 0  # where this step's entries go
        self.length = 0  # entries valid after this step

    def begin(self, n_new: int) -> None:
        self.length = self.start + n_new

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        self.k[layer, :, :, self.start : self.length] = k
        self.v[layer, :, :, self.start : self.length] = v
        return self.k[layer, :, :, : self.length], self.v[layer, :, :, : self.length]

    def advance(self) -> None:
        self.start = self.length
