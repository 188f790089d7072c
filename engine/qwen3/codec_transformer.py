"""The codec decoder's transformer (engine/qwen3/codec_decoder.py's pre_transformer): 8 causal
sliding-window layers at the frame rate, streaming with each attention layer's K/V of its last
window - 1 frames as state (codec_state.py).

As served, a layer is ~16 launches on CUDA: q|k|v and gate|up are one GEMM each, each layer scale
is folded into the projection that ends its branch (scale * (a @ W.T) = a @ (scale * W).T), the
residual adds run inside those GEMMs in place, q and k are rotated in one pass, the mask is made
additive once per call, and the RMS norms and SwiGLU run on the decode path's row kernels. Eager,
a layer was ~45 small kernels, most of a one-frame codec call's fixed cost.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .codec_state import StateIO
from .config import CodecConfig
from .layers import LayerScale, NormFn, RMSNorm, SwiGLU, rms_norm, silu_mul
from .rope import cos_sin, inv_freq, rotate


def norm_fn(kernels: bool) -> NormFn:
    """The codec's RMS norm over its last axis: eager torch ops, or the one-launch row kernel."""
    if not kernels:
        return rms_norm
    from voicewire.kernels.fused_linear import rms_norm_rows

    def norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
        return rms_norm_rows(x.reshape(-1, x.shape[-1]), weight, eps).view(x.shape)

    return norm


class WindowAttention(nn.Module):
    """Causal sliding-window attention (no q/k norms), streaming with a K/V tail of window-1 frames."""

    def __init__(self, cfg: CodecConfig) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.tail = cfg.sliding_window - 1
        d, b = cfg.hidden_size, cfg.attention_bias
        self.q_proj = nn.Linear(d, self.heads * self.head_dim, bias=b)
        self.k_proj = nn.Linear(d, self.kv_heads * self.head_dim, bias=b)
        self.v_proj = nn.Linear(d, self.kv_heads * self.head_dim, bias=b)
        self.o_proj = nn.Linear(self.heads * self.head_dim, d, bias=b)
        # q|k|v as one ((H + 2 KVH) hd, D) weight and bias: one GEMM; derived in ``prepare``, never saved
        self.register_buffer("qkv_w", torch.empty(0), persistent=False)
        self.register_buffer("qkv_b", torch.empty(0), persistent=False)

    @torch.no_grad()
    def prepare(self) -> None:
        projs = (self.q_proj, self.k_proj, self.v_proj)
        self.qkv_w = torch.cat([p.weight for p in projs]).contiguous()
        bias: list[Tensor] = [p.bias for p in projs if p.bias is not None]
        self.qkv_b = torch.cat(bias) if bias else self.qkv_w.new_zeros(0)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor, io: StateIO) -> Tensor:
        """x (B, T, D), normed; mask (B, 1, T, tail + T) additive, over [the tail, the new frames]
        -> (B, T, H hd), the input of o_proj."""
        b, t, _ = x.shape
        h, kvh, hd = self.heads, self.kv_heads, self.head_dim
        qkv = F.linear(x, self.qkv_w, self.qkv_b if self.qkv_b.numel() else None)  # (B, T, (H + 2 KVH) hd)
        # q's and k's heads are next to each other in the fused projection: rotated in one pass
        qk = rotate(qkv[..., : (h + kvh) * hd].view(b, t, h + kvh, hd).transpose(1, 2), cos, sin)
        v = qkv[..., (h + kvh) * hd :].view(b, t, kvh, hd).transpose(1, 2)
        # the tail keeps K's heads then V's (B, 2 KVH, tail, hd), one piece of state for both
        kv = torch.cat((io.take(2 * kvh, self.tail, hd), torch.cat((qk[:, h:], v), dim=1)), dim=2)
        io.put(kv, self.tail, dim=2)
        out = F.scaled_dot_product_attention(
            qk[:, :h], kv[:, :kvh], kv[:, kvh:], attn_mask=mask, enable_gqa=h != kvh
        )
        return out.transpose(1, 2).reshape(b, t, h * hd)


class CodecLayer(nn.Module):
    def __init__(self, cfg: CodecConfig) -> None:
        super().__init__()
        self.self_attn = WindowAttention(cfg)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn_layer_scale = LayerScale(cfg.hidden_size, cfg.layer_scale_initial_scale)
        self.mlp_layer_scale = LayerScale(cfg.hidden_size, cfg.layer_scale_initial_scale)
        # derived in ``prepare``, never saved: o_proj and down_proj with their layer scales folded in
        # (scale * (a @ W.T) = a @ (scale * W).T, so a branch and its residual add are one addmm), the
        # scaled o bias (empty without bias), and gate|up as one weight
        self.register_buffer("o_w", torch.empty(0), persistent=False)
        self.register_buffer("o_b", torch.empty(0), persistent=False)
        self.register_buffer("down_w", torch.empty(0), persistent=False)
        self.register_buffer("gate_up_w", torch.empty(0), persistent=False)
        self.act: Callable[[Tensor], Tensor] = silu_mul

    @torch.no_grad()
    def prepare(self, kernels: bool) -> None:
        """Fold the weights (above); on ``kernels`` the RMS norms and the SwiGLU activation run on
        the one-launch row kernels (kernels/fused_linear.py), which round as these torch ops do."""
        self.self_attn.prepare()
        o, mlp = self.self_attn.o_proj, self.mlp
        s_attn, s_mlp = self.self_attn_layer_scale.scale.float(), self.mlp_layer_scale.scale.float()
        self.o_w = (o.weight.float() * s_attn[:, None]).to(o.weight.dtype)
        self.o_b = (o.bias.float() * s_attn).to(o.bias.dtype) if o.bias is not None else self.o_w.new_zeros(0)
        self.down_w = (mlp.down_proj.weight.float() * s_mlp[:, None]).to(mlp.down_proj.weight.dtype)
        self.gate_up_w = torch.cat((mlp.gate_proj.weight, mlp.up_proj.weight)).contiguous()
        self.input_layernorm.fn = self.post_attention_layernorm.fn = norm_fn(kernels)
        if kernels:
            from voicewire.kernels.fused_linear import silu_mul_rows

            self.act = silu_mul_rows
        else:
            self.act = silu_mul

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor, io: StateIO) -> Tensor:
        b, t, d = x.shape
        a = self.self_attn(self.input_layernorm(x), cos, sin, mask, io).reshape(b * t, -1)
        rows = x.reshape(b * t, d)  # the residual stream, added into in place (ResidualUnit says why)
        rows.addmm_(a, self.o_w.t())
        if self.o_b.numel():
            rows += self.o_b
        gate_up = F.linear(self.post_attention_layernorm(rows), self.gate_up_w)
        return rows.addmm_(self.act(gate_up), self.down_w.t()).view(b, t, d)


class CodecTransformer(nn.Module):
    rope_freqs: Tensor

    def __init__(self, cfg: CodecConfig) -> None:
        super().__init__()
        self.window = cfg.sliding_window
        self.input_proj = nn.Linear(cfg.latent_dim, cfg.hidden_size)
        self.layers = nn.ModuleList(CodecLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.output_proj = nn.Linear(cfg.hidden_size, cfg.latent_dim)
        self.register_buffer("rope_freqs", inv_freq(cfg.head_dim, cfg.rope_theta), persistent=False)

    def forward(self, x: Tensor, start: Tensor, io: StateIO) -> Tensor:
        """x (B, T, latent) for frames starting at ``start`` (B,) -> (B, T, latent)."""
        t = x.shape[1]
        tail = self.window - 1
        steps = torch.arange(t, device=x.device)
        q_pos = start[:, None] + steps  # (B, T)
        k_pos = start[:, None] - tail + torch.arange(tail + t, device=x.device)  # (B, tail + T)
        diff = q_pos[:, :, None] - k_pos[:, None, :]  # (B, T, S)
        # planned once per call, used by every layer: causal, within the window, not before frame 0;
        # additive, so attention does not convert a boolean mask in every layer. Every query sees
        # itself, so no row is all -inf.
        allowed = (diff >= 0) & (diff < self.window) & (k_pos[:, None, :] >= 0)
        mask = torch.zeros(allowed.shape, dtype=x.dtype, device=x.device)
        mask.masked_fill_(~allowed, float("-inf"))
        cos, sin = cos_sin(q_pos, self.rope_freqs)
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        h = self.input_proj(x)
        for layer in self.layers:
            h = layer(h, cos, sin, mask[:, None], io)
        return self.output_proj(self.norm(h))
