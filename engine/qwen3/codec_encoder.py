"""The speech tokenizer's encoder: 24 kHz PCM -> codes (T, 16), the reference frames of in-context cloning.

The 12 Hz tokenizer encodes with a Mimi encoder (the decoder half is codec_decoder.py):

    pcm (B, 1, S)
      -> SEANet: conv k7 -> per ratio 4, 5, 6, 8: residual unit (ELU, conv k3 dilated, ELU, conv k1)
         + ELU + strided conv (k = 2 * ratio) -> ELU + conv k3        (B, hidden, ceil(S / 960))  25 Hz
      -> causal transformer (LayerNorm, RoPE attention, GELU MLP, layer scales)
      -> strided conv k4 s2, edge-replicate padded                    (B, hidden, ceil(S / 1920)) 12.5 Hz
      -> split residual VQ: the semantic RVQ (1 codebook) and the acoustic RVQ (the rest) each project
         the same frames (1x1 conv) and quantize greedily, nearest centroid by Euclidean distance
      -> codes (B, 16, T): the first ``valid_quantizers`` of the 1 + 31 codebooks

Every convolution is causal: padded on the left by kernel - stride (dilated), on the right only up to
a whole stride, so the frame count is ceil(S / 1920) and a frame depends on no later audio. The
transformer attends causally over the whole clip: the checkpoint's 250-frame sliding window is
honoured only by the reference's flash-attention path, not by its default one, and a reference clip
is far shorter than 10 s in practice. Parameter names follow the official checkpoint below
``encoder.`` in speech_tokenizer/model.safetensors.
"""

from __future__ import annotations

import math
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import CodecEncoderConfig
from .layers import LayerScale
from .rope import cos_sin, inv_freq, rotate

USAGE_EPS = 1e-5  # floor of a centroid's usage count when the mean is formed


class CausalConv(nn.Module):
    def __init__(
        self,
        c_in: int,
        c_out: int,
        kernel: int,
        stride: int = 1,
        dilation: int = 1,
        bias: bool = True,
        pad_mode: str = "constant",
    ) -> None:
        super().__init__()
        self.conv = nn.Conv1d(c_in, c_out, kernel, stride, dilation=dilation, bias=bias)
        self.stride, self.pad_mode = stride, pad_mode
        self.left = (kernel - 1) * dilation + 1 - stride

    def forward(self, x: Tensor) -> Tensor:
        """(B, C, L) -> (B, C', ceil(L / stride))."""
        right = -x.shape[-1] % self.stride  # up to a whole stride: the last partial frame counts
        return self.conv(F.pad(x, (self.left, right), mode=self.pad_mode))


class ResidualUnit(nn.Module):
    def __init__(self, cfg: CodecEncoderConfig, dim: int, dilation: int) -> None:
        super().__init__()
        hidden = dim // cfg.compress
        self.block = nn.ModuleList(
            [
                nn.ELU(),
                CausalConv(dim, hidden, cfg.residual_kernel_size, dilation=dilation, pad_mode=cfg.pad_mode),
                nn.ELU(),
                CausalConv(hidden, dim, 1, pad_mode=cfg.pad_mode),
            ]
        )
        self.shortcut = CausalConv(dim, dim, 1, pad_mode=cfg.pad_mode) if cfg.use_conv_shortcut else None

    def forward(self, x: Tensor) -> Tensor:
        y = x
        for layer in self.block:
            y = layer(y)
        return (x if self.shortcut is None else self.shortcut(x)) + y


class SEANetEncoder(nn.Module):
    """Module indices match the checkpoint's ``encoder.encoder.layers.{i}`` (ELUs hold no weights)."""

    def __init__(self, cfg: CodecEncoderConfig) -> None:
        super().__init__()
        pad = cfg.pad_mode
        layers: list[nn.Module] = [
            CausalConv(cfg.audio_channels, cfg.num_filters, cfg.kernel_size, pad_mode=pad)
        ]
        dim = cfg.num_filters
        for ratio in reversed(cfg.upsampling_ratios):
            layers += [
                ResidualUnit(cfg, dim, cfg.dilation_growth_rate**j) for j in range(cfg.num_residual_layers)
            ]
            layers += [nn.ELU(), CausalConv(dim, dim * 2, 2 * ratio, stride=ratio, pad_mode=pad)]
            dim *= 2
        layers += [nn.ELU(), CausalConv(dim, cfg.hidden_size, cfg.last_kernel_size, pad_mode=pad)]
        self.layers = nn.ModuleList(layers)

    def forward(self, x: Tensor) -> Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class Attention(nn.Module):
    def __init__(self, cfg: CodecEncoderConfig) -> None:
        super().__init__()
        h, hd, bias = cfg.hidden_size, cfg.head_dim, cfg.attention_bias
        self.heads, self.kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, hd
        self.q_proj = nn.Linear(h, cfg.num_heads * hd, bias=bias)
        self.k_proj = nn.Linear(h, cfg.num_kv_heads * hd, bias=bias)
        self.v_proj = nn.Linear(h, cfg.num_kv_heads * hd, bias=bias)
        self.o_proj = nn.Linear(cfg.num_heads * hd, h, bias=bias)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """x (B, T, H), cos/sin (B, T, hd) -> (B, T, H), causal."""
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        rep = self.heads // self.kv_heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, nh, T, hd)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, cfg: CodecEncoderConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.fc2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class TransformerLayer(nn.Module):
    def __init__(self, cfg: CodecEncoderConfig) -> None:
        super().__init__()
        h = cfg.hidden_size
        self.input_layernorm = nn.LayerNorm(h, eps=cfg.norm_eps)
        self.self_attn = Attention(cfg)
        self.self_attn_layer_scale = LayerScale(h, cfg.layer_scale_initial_scale)
        self.post_attention_layernorm = nn.LayerNorm(h, eps=cfg.norm_eps)
        self.mlp = MLP(cfg)
        self.mlp_layer_scale = LayerScale(h, cfg.layer_scale_initial_scale)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        x = x + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(x), cos, sin))
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))


class Transformer(nn.Module):
    def __init__(self, cfg: CodecEncoderConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(TransformerLayer(cfg) for _ in range(cfg.num_layers))
        self.freqs = inv_freq(cfg.head_dim, cfg.rope_theta)  # not a buffer: stays float32

    def forward(self, x: Tensor) -> Tensor:
        """x (B, T, H) -> (B, T, H)."""
        positions = torch.arange(x.shape[1], device=x.device)[None].expand(x.shape[0], -1)
        cos, sin = cos_sin(positions, self.freqs)
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return x


class Codebook(nn.Module):
    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        # the checkpoint stores running sums and usage counts; a centroid is their ratio
        self.embed_sum = nn.Parameter(torch.zeros(size, dim))
        self.cluster_usage = nn.Parameter(torch.ones(size))

    def centroids(self) -> Tensor:
        return self.embed_sum / self.cluster_usage.clamp(min=USAGE_EPS)[:, None]  # (size, dim)


class _CodebookSlot(nn.Module):
    """``layers.{i}.codebook``: the checkpoint nests each codebook one level down."""

    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self.codebook = Codebook(size, dim)


class ResidualVQ(nn.Module):
    def __init__(self, cfg: CodecEncoderConfig, n_codebooks: int) -> None:
        super().__init__()
        d = cfg.vector_quantization_hidden_dimension
        self.input_proj = nn.Conv1d(cfg.hidden_size, d, 1, bias=False) if d != cfg.hidden_size else None
        self.layers = nn.ModuleList(
            _CodebookSlot(cfg.codebook_size, cfg.codebook_dim) for _ in range(n_codebooks)
        )

    def encode(self, x: Tensor, n: int) -> Tensor:
        """x (B, hidden, T) -> codes (n, B, T): each codebook quantizes what the previous ones left."""
        if self.input_proj is not None:
            x = self.input_proj(x)
        b, d, t = x.shape
        residual = x.transpose(1, 2).reshape(b * t, d)  # (N, D)
        codes = []
        for slot in list(self.layers)[:n]:
            table = cast(_CodebookSlot, slot).codebook.centroids()
            idx = torch.cdist(residual[None].float(), table[None].float())[0].argmin(dim=-1)  # (N,)
            residual = residual - table[idx]
            codes.append(idx.view(b, t))
        return torch.stack(codes)


class SplitResidualVQ(nn.Module):
    def __init__(self, cfg: CodecEncoderConfig) -> None:
        super().__init__()
        self.n_semantic = cfg.num_semantic_quantizers
        self.semantic_residual_vector_quantizer = ResidualVQ(cfg, cfg.num_semantic_quantizers)
        self.acoustic_residual_vector_quantizer = ResidualVQ(
            cfg, cfg.num_quantizers - cfg.num_semantic_quantizers
        )

    def encode(self, x: Tensor, n: int) -> Tensor:
        """x (B, hidden, T) -> codes (B, n, T), semantic codebooks first."""
        codes = self.semantic_residual_vector_quantizer.encode(x, self.n_semantic)
        if n > self.n_semantic:
            rest = self.acoustic_residual_vector_quantizer.encode(x, n - self.n_semantic)
            codes = torch.cat((codes, rest))
        return codes.transpose(0, 1)


class CodecEncoder(nn.Module):
    def __init__(self, cfg: CodecEncoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.encoder = SEANetEncoder(cfg)
        self.encoder_transformer = Transformer(cfg)
        s = cfg.downsample_stride
        self.downsample = CausalConv(
            cfg.hidden_size, cfg.hidden_size, 2 * s, stride=2, bias=False, pad_mode="replicate"
        )
        self.quantizer = SplitResidualVQ(cfg)

    def forward(self, pcm: Tensor) -> Tensor:
        """pcm (B, S) -> codes (B, valid_quantizers, ceil(S / frame_samples)) int64."""
        x = self.encoder(pcm[:, None])  # (B, hidden, T25)
        x = self.encoder_transformer(x.transpose(1, 2)).transpose(1, 2)
        x = self.downsample(x)  # (B, hidden, T)
        codes = self.quantizer.encode(x, self.cfg.valid_quantizers)
        return codes[..., : math.ceil(pcm.shape[1] / self.cfg.frame_samples)]

    @torch.no_grad()
    def encode(self, pcm: Tensor) -> Tensor:
        """pcm (S,) float at ``cfg.sample_rate_hz`` -> codes (T, 16) int64 on the module's device."""
        w = cast(CausalConv, self.encoder.layers[0]).conv.weight
        return self(pcm.to(device=w.device, dtype=w.dtype)[None])[0].T.contiguous()
