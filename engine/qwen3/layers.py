"""Building blocks shared by the talker and the code predictor: a Qwen3 decoder layer.

Parameter names follow the official checkpoint (``self_attn.q_proj`` ...), so ``weights.py`` maps a
checkpoint onto these modules by prefix alone.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .rope import rotate


class RMSNorm(nn.Module):
    """RMS norm computed in float32, scaled in the input dtype (as the reference does)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        xf = x.to(torch.float32)
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class KVStore(Protocol):
    """Where a layer's keys/values live. ``update`` stores the new ones and returns what to attend over."""

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """k, v: (B, Hkv, T, hd) new entries -> (B, Hkv, S, hd) keys/values for this step's attention."""
        ...


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

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, kv: KVStore, mask: Tensor | None) -> Tensor:
        """x (B, T, D); cos/sin (B, T, hd); mask (B, 1, T, S) bool, True = may attend; None = all."""
        b, t, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, t, self.heads, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(b, t, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        k_all, v_all = kv.update(self.layer, k, v)  # (B, Hkv, S, hd)
        out = F.scaled_dot_product_attention(
            q, k_all, v_all, attn_mask=mask, enable_gqa=self.heads != self.kv_heads
        )  # (B, H, T, hd)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.heads * self.head_dim))


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

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, kv: KVStore, mask: Tensor | None) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, kv, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


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
