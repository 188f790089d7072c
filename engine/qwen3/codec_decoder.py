"""The 12 Hz codec decoder (code2wav): 16 codebooks per frame -> 1920 PCM samples per frame, streaming.

    codes (B, 16, T)
      -> RVQ dequantize: sum over codebooks of (embedding_sum / cluster_usage)[code] @ output_proj
      -> pre_conv: causal conv k=3, codebook_dim -> latent                      (B, latent, T)
      -> pre_transformer: 8 layers, sliding window 72, LayerScale              (B, T, latent)
      -> upsample x2: [transposed conv k=s=2, ConvNeXt (causal dwconv k=7)]    (B, latent, 4T)
      -> decoder: causal conv k=7 -> 4 x [SnakeBeta, transposed conv k=2r s=r, 3 residual units
         (dilation 1, 3, 9)] for r = 8, 5, 4, 3 -> SnakeBeta -> causal conv k=7 -> clamp(-1, 1)
                                                                                (B, 1920 T)

Every layer is causal, so the state that carries a stream from one chunk to the next is small and
fixed: each causal conv keeps its last (k-1)*dilation input columns, each overlapping transposed
conv its last input frame (its output for frame i needs frames i and i-1), each attention layer the
keys/values of its last window-1 frames (stored rotated, at their absolute positions). With that
state a chunk is decoded once and the concatenated output equals the offline decode of the same
frames up to float rounding; the offline decode is the stream of one chunk from a fresh state.
Rows of one call may carry different frame counts, padded to a common T (``stream``'s ``n_valid``):
the state each layer keeps is then the tail ending at the row's last valid frame (codec_state.py).

``decode_windowed`` is the stateless fallback and the reference it is compared with: re-decode
``left_context`` earlier frames with every chunk and keep the new samples.
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .codec_state import StateIO
from .config import CodecConfig
from .layers import RMSNorm, SwiGLU
from .rope import cos_sin, inv_freq, rotate


class CausalConv(nn.Module):
    """Conv1d padded on the left only; the padding is the stream's history (zeros at the start)."""

    def __init__(self, cin: int, cout: int, kernel: int, dilation: int = 1, groups: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, dilation=dilation, groups=groups)
        self.history = (kernel - 1) * dilation
        self.cin = cin

    def forward(self, x: Tensor, io: StateIO) -> Tensor:
        """x (B, C, T) -> (B, C', T)."""
        if self.history == 0:
            return self.conv(x)
        xx = torch.cat((io.take(self.cin, self.history), x), dim=-1)
        io.put(xx, self.history)
        return self.conv(xx)


class CausalTransConv(nn.Module):
    """ConvTranspose1d(kernel k, stride s) trimmed by k - s on the right: s output samples per input frame.

    For k = 2s an output frame mixes two input frames, so the state is the previous input frame.
    """

    def __init__(self, cin: int, cout: int, kernel: int, stride: int) -> None:
        super().__init__()
        if (kernel - stride) % stride:
            raise ValueError(
                f"transposed conv overlap {kernel - stride} is not a multiple of stride {stride}"
            )
        self.conv = nn.ConvTranspose1d(cin, cout, kernel, stride=stride)
        self.stride, self.prev = stride, (kernel - stride) // stride
        self.cin = cin

    def forward(self, x: Tensor, io: StateIO) -> Tensor:
        """x (B, C, T) -> (B, C', s T)."""
        t = x.shape[-1]
        if self.prev == 0:
            return self.conv(x)
        xx = torch.cat((io.take(self.cin, self.prev), x), dim=-1)
        io.put(xx, self.prev)
        start = self.prev * self.stride
        return self.conv(xx)[..., start : start + t * self.stride]


class SnakeBeta(nn.Module):
    """x + 1 / (exp(beta) + 1e-9) * sin(x * exp(alpha))^2, per channel."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.beta = nn.Parameter(torch.zeros(channels))
        self._consts: tuple[Tensor, Tensor] | None = None  # (exp(alpha), 1 / (exp(beta) + 1e-9)) fp32

    @torch.no_grad()
    def prepare(self, kernel: bool) -> None:
        """Use the one-pass Triton kernel (kernels/snake.py) from now on, or the torch ops."""
        self._consts = None
        if kernel:
            a = torch.exp(self.alpha.float()).contiguous()
            self._consts = (a, (1.0 / (torch.exp(self.beta.float()) + 1e-9)).contiguous())

    def forward(self, x: Tensor) -> Tensor:
        if self._consts is not None:
            from voicewire.kernels.snake import snake

            return snake(x, *self._consts)
        alpha = torch.exp(self.alpha)[None, :, None]
        inv_beta = 1.0 / (torch.exp(self.beta)[None, :, None] + 1e-9)
        return x + inv_beta * torch.sin(x * alpha).pow(2)


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dwconv = CausalConv(dim, dim, 7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 1e-6))

    def forward(self, x: Tensor, io: StateIO) -> Tensor:
        h = self.dwconv(x, io).transpose(1, 2)  # (B, T, C)
        h = self.pwconv2(F.gelu(self.pwconv1(self.norm(h))))
        return x + (self.gamma * h).transpose(1, 2)


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int) -> None:
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv(dim, dim, 7, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv(dim, dim, 1)

    def forward(self, x: Tensor, io: StateIO) -> Tensor:
        return x + self.conv2(self.act2(self.conv1(self.act1(x), io)), io)


class DecoderBlock(nn.Module):
    """SnakeBeta -> upsampling transposed conv (C -> C/2, x rate) -> 3 residual units."""

    def __init__(self, cin: int, rate: int) -> None:
        super().__init__()
        cout = cin // 2
        self.block = nn.ModuleList(
            [SnakeBeta(cin), CausalTransConv(cin, cout, 2 * rate, rate)]
            + [ResidualUnit(cout, d) for d in (1, 3, 9)]
        )

    def forward(self, x: Tensor, io: StateIO) -> Tensor:
        snake, up, *units = self.block
        x = up(snake(x), io)
        for unit in units:
            x = unit(x, io)
        return x


class LayerScale(nn.Module):
    def __init__(self, dim: int, init: float) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), init))

    def forward(self, x: Tensor) -> Tensor:
        return self.scale * x


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

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor, io: StateIO) -> Tensor:
        """x (B, T, D); mask (B, 1, T, tail + T) over [the tail, the new frames]."""
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        k_all = torch.cat((io.take(self.kv_heads, self.tail, self.head_dim), k), dim=2)
        v_all = torch.cat((io.take(self.kv_heads, self.tail, self.head_dim), v), dim=2)
        io.put(k_all, self.tail, dim=2)
        io.put(v_all, self.tail, dim=2)
        out = F.scaled_dot_product_attention(
            q, k_all, v_all, attn_mask=mask, enable_gqa=self.heads != self.kv_heads
        )
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.heads * self.head_dim))


class CodecLayer(nn.Module):
    def __init__(self, cfg: CodecConfig) -> None:
        super().__init__()
        self.self_attn = WindowAttention(cfg)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn_layer_scale = LayerScale(cfg.hidden_size, cfg.layer_scale_initial_scale)
        self.mlp_layer_scale = LayerScale(cfg.hidden_size, cfg.layer_scale_initial_scale)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor, io: StateIO) -> Tensor:
        x = x + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(x), cos, sin, mask, io))
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))


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
        # planned once per call, used by every layer: causal, within the window, not before frame 0
        mask = ((diff >= 0) & (diff < self.window) & (k_pos[:, None, :] >= 0))[:, None]
        cos, sin = cos_sin(q_pos, self.rope_freqs)
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        h = self.input_proj(x)
        for layer in self.layers:
            h = layer(h, cos, sin, mask, io)
        return self.output_proj(self.norm(h))


class CodecDecoder(nn.Module):
    def __init__(self, cfg: CodecConfig) -> None:
        super().__init__()
        self.cfg = cfg
        q, v, d = cfg.num_quantizers, cfg.codebook_size, cfg.codebook_dim // 2
        # RVQ: codebook 0 (semantic) and 1..15 (acoustic) have their own 1x1 output projection
        self.codebook_sum = nn.Parameter(torch.zeros(q, v, d))  # official: embedding_sum
        self.cluster_usage = nn.Parameter(torch.ones(q, v))
        self.proj_first = nn.Parameter(torch.zeros(cfg.codebook_dim, d))
        self.proj_rest = nn.Parameter(torch.zeros(cfg.codebook_dim, d))
        self.pre_conv = CausalConv(cfg.codebook_dim, cfg.latent_dim, 3)
        self.pre_transformer = CodecTransformer(cfg)
        self.upsample = nn.ModuleList(
            nn.ModuleList(
                [CausalTransConv(cfg.latent_dim, cfg.latent_dim, r, r), ConvNeXtBlock(cfg.latent_dim)]
            )
            for r in cfg.upsampling_ratios
        )
        blocks: list[nn.Module] = [CausalConv(cfg.latent_dim, cfg.decoder_dim, 7)]
        blocks += [DecoderBlock(cfg.decoder_dim // 2**i, r) for i, r in enumerate(cfg.upsample_rates)]
        out_dim = cfg.decoder_dim // 2 ** len(cfg.upsample_rates)
        blocks += [SnakeBeta(out_dim), CausalConv(out_dim, 1, 7)]
        self.decoder = nn.ModuleList(blocks)
        self._tables: Tensor | None = None
        self.state_width = 0

    @torch.no_grad()
    def prepare(self, snake_kernel: bool | None = None) -> None:
        """Fold the RVQ normalization and output projections into one (Q, V, codebook_dim) table, and
        set the SnakeBeta activations on the one-pass kernel (``snake_kernel``; None = on CUDA).

        Call after loading weights (the model does). Sum-then-project in the reference becomes
        project-then-sum here: the same math, a float-rounding difference.
        """
        kernel = self.codebook_sum.is_cuda if snake_kernel is None else snake_kernel
        for m in self.modules():
            if isinstance(m, SnakeBeta):
                m.prepare(kernel)
        emb = self.codebook_sum.float() / self.cluster_usage.float().clamp(min=1e-5)[..., None]  # (Q, V, d)
        first = emb[:1] @ self.proj_first.float().T
        rest = emb[1:] @ self.proj_rest.float().T
        self._tables = torch.cat((first, rest)).to(self.codebook_sum.dtype)
        dev = self.codebook_sum.device
        io = StateIO(None, 1, self.codebook_sum.dtype, dev)
        self._run(
            torch.zeros(1, self.cfg.num_quantizers, 1, dtype=torch.int64, device=dev),
            torch.zeros(1, dtype=torch.int64, device=dev),
            io,
        )
        self.state_width = io.offset

    def fresh_state(self, batch: int) -> tuple[Tensor, Tensor]:
        dev = self.codebook_sum.device
        return (
            torch.zeros(batch, self.state_width, dtype=self.codebook_sum.dtype, device=dev),
            torch.zeros(batch, dtype=torch.int64, device=dev),
        )

    @torch.no_grad()
    def stream(
        self, codes: Tensor, state: Tensor, start: Tensor, n_valid: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Decode the next T frames of B streams, or the first ``n_valid`` (B,) int64 of each row.

        codes (B, Q, T) int64; state (B, N) and start (B,) from ``fresh_state`` or the last call
        -> (pcm (B, T * 1920) float32, next state, next start). With ``n_valid`` the frames after a
        row's n_b are padding: its first n_b * 1920 samples, next state and next start are those of
        decoding its n_b frames alone; its later samples are meaningless.
        """
        t = codes.shape[-1]
        io = StateIO(state, codes.shape[0], state.dtype, state.device, t, n_valid)
        pcm = self._run(codes, start, io)
        return pcm, io.next_flat(), start + (t if n_valid is None else n_valid)

    @torch.no_grad()
    def decode(self, codes: Tensor) -> Tensor:
        """Offline: codes (B, Q, T) -> (B, T * 1920) float32."""
        state, start = self.fresh_state(codes.shape[0])
        return self.stream(codes, state, start)[0]

    @torch.no_grad()
    def decode_windowed(self, codes: Tensor, n_new: int, left_context: int) -> Tensor:
        """Stateless reference: decode the last ``n_new`` of ``codes`` (B, Q, T) re-decoding at most
        ``left_context`` frames before them -> (B, n_new * 1920)."""
        t = codes.shape[-1]
        first = max(0, t - n_new - left_context)
        pcm = self.decode(codes[..., first:])
        return pcm[:, -n_new * self.cfg.frame_samples :]

    def _run(self, codes: Tensor, start: Tensor, io: StateIO) -> Tensor:
        if self._tables is None:
            raise RuntimeError("CodecDecoder.prepare() was not called after loading weights")
        q = codes.shape[1]
        rows = torch.arange(q, device=codes.device)[None, :, None]
        x = self._tables[rows, codes].sum(dim=1).transpose(1, 2)  # (B, codebook_dim, T)
        x = self.pre_conv(x, io).transpose(1, 2)  # (B, T, latent)
        x = self.pre_transformer(x, start, io).transpose(1, 2)  # (B, latent, T)
        for stage in self.upsample:
            up, convnext = cast(nn.ModuleList, stage)  # [transposed conv, ConvNeXt]
            x = convnext(up(x, io), io)
        for block in self.decoder:
            x = block(x, io) if isinstance(block, CausalConv | DecoderBlock) else block(x)
        return x[:, 0].clamp(-1.0, 1.0).to(torch.float32)
