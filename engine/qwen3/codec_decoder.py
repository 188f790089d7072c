"""The 12 Hz codec decoder (code2wav): 16 codebooks per frame -> 1920 PCM samples per frame, streaming.

    codes (B, 16, T)
      -> RVQ dequantize: sum over codebooks of (embedding_sum / cluster_usage)[code] @ output_proj
      -> pre_conv: causal conv k=3, codebook_dim -> latent                      (B, T, latent)
      -> pre_transformer: 8 layers, sliding window 72 (codec_transformer.py)   (B, T, latent)
      -> upsample x2: [transposed conv k=s=2, ConvNeXt (causal dwconv k=7)]    (B, 4T, latent)
      -> decoder: causal conv k=7 -> 4 x [SnakeBeta, transposed conv k=2r s=r, 3 residual units
         (dilation 1, 3, 9)] for r = 8, 5, 4, 3 -> SnakeBeta -> causal conv k=7 -> clamp(-1, 1)
                                                                                (B, 1920 T)

Every layer is causal, so the state that carries a stream from one chunk to the next is small and
fixed: each causal conv keeps its last (k-1)*dilation input steps, each overlapping transposed
conv its last input frame (its output for frame i needs frames i and i-1), each attention layer the
keys/values of its last window-1 frames (stored rotated, at their absolute positions).

Activations are time-major, (B, T, C), from the codebook lookup to the last conv: the convs of k > 1
run on that memory as kernels/conv1d.py's implicit GEMM and depthwise kernels (``prepare``'s
``conv_kernel``, served on CUDA) or cuDNN's NHWC kernels, the 1x1 convs and transposed convs as matmuls, and a conv's bias
is added by the SnakeBeta after it, which also writes its output with the next conv's history in
front (kernels/snake.py). So no layout transform, concatenation or bias pass runs over the large
activations (a profile of the (N, C, T) form had those at about two thirds of a codec call). With that
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
from .codec_transformer import CodecLayer, CodecTransformer, norm_fn
from .config import CodecConfig


def _conv_nhwc(xx: Tensor, w4: Tensor, bias: Tensor | None, dilation: int = 1, groups: int = 1) -> Tensor:
    """xx (B, L, Cin) contiguous -> (B, L - (k - 1) d, Cout) contiguous: a 1-D conv as cuDNN's NHWC conv2d
    of height 1, which runs on the time-major memory as it is (an (N, C, T) conv1d is wrapped in two
    layout transforms, each a pass over the activation)."""
    y = F.conv2d(xx.transpose(1, 2).unsqueeze(2), w4, bias, dilation=(1, dilation), groups=groups)
    return y.squeeze(2).transpose(1, 2).contiguous()


class CausalConv(nn.Module):
    """Conv1d padded on the left only; the padding is the stream's history (zeros at the start).

    Activations are time-major, (B, T, C). ``prepare`` lays the weight out for ``_conv_nhwc`` (or, for a
    1x1 conv, as the (Cin, Cout) matrix of a matmul)."""

    def __init__(self, cin: int, cout: int, kernel: int, dilation: int = 1, groups: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, dilation=dilation, groups=groups)
        self.history = (kernel - 1) * dilation
        self.cin = cin
        # the weight as ``_conv_nhwc`` takes it (a 1x1 conv's as a matmul's (Cin, Cout)), the taps as
        # kernels/conv1d.py takes them (when it runs this conv), and the bias in float32 for the
        # SnakeBeta after it to add (``shift``); derived in ``prepare``, never saved
        self.register_buffer("w4", torch.empty(0), persistent=False)
        self.register_buffer("taps", torch.empty(0), persistent=False)
        self.register_buffer("bias32", torch.empty(0), persistent=False)

    @torch.no_grad()
    def prepare(self, conv_kernel: bool = False) -> None:
        """``conv_kernel``: a conv of k > 1, dense or depthwise, runs on kernels/conv1d.py instead of cuDNN."""
        w = self.conv.weight
        self.w4 = w[:, :, 0].T.contiguous() if w.shape[-1] == 1 else w[:, :, None].contiguous(
            memory_format=torch.channels_last
        )
        self.taps = w.new_zeros(0)
        groups = self.conv.groups
        if conv_kernel and w.shape[-1] > 1 and (groups == 1 or groups == self.cin == self.conv.out_channels):
            from voicewire.kernels.conv1d import stack_taps  # Triton only where asked for

            self.taps = stack_taps(w.detach())
        self.bias32 = self.conv.bias.detach().to(torch.float32, copy=True) if self.conv.bias is not None else w.new_zeros(0)

    def forward(self, x: Tensor, io: StateIO, bias: bool = True) -> Tensor:
        """x (B, T, C) -> (B, T, C'); without ``bias`` the caller adds ``bias32`` later."""
        xx = x if self.history == 0 else torch.cat((io.take(self.history, self.cin), x), dim=1)
        if self.history:
            io.put(xx, self.history, dim=1)
        return self.run(xx, bias, io.cudnn_convs)

    def run(self, xx: Tensor, bias: bool = False, cudnn: bool = False) -> Tensor:
        """The conv of its whole input xx (B, history + T, C), history included (no state touched);
        ``cudnn``: on cuDNN even where ``prepare`` laid out the kernel's taps."""
        c = self.conv
        if self.taps.numel() and not cudnn:
            from voicewire.kernels.conv1d import conv1d_tm

            k, d = c.kernel_size[0], c.dilation[0]
            return conv1d_tm(xx, self.taps, k, d, c.bias if bias else None, depthwise=c.groups > 1)
        return _conv_nhwc(xx, self.w4, c.bias if bias else None, c.dilation[0], c.groups)


class CausalTransConv(nn.Module):
    """ConvTranspose1d(kernel k, stride s) trimmed by k - s on the right: s output samples per input frame.

    Output frame t is x_t @ W[..., :s] for k = s, and x_t @ W[..., :s] + x_{t-1} @ W[..., s:] for
    k = 2s: a matmul of [x_t, x_{t-1}] (SnakeBeta's ``pair`` layout) by the (2 Cin, s Cout) weight, so
    the state is the previous input frame. ``prepare`` lays the weight out as that matrix.
    """

    def __init__(self, cin: int, cout: int, kernel: int, stride: int) -> None:
        super().__init__()
        if kernel not in (stride, 2 * stride):
            raise ValueError(f"transposed conv kernel {kernel} must be stride {stride} or twice it")
        self.conv = nn.ConvTranspose1d(cin, cout, kernel, stride=stride)
        self.stride, self.prev = stride, (kernel - stride) // stride
        self.cin, self.cout = cin, cout
        # derived in ``prepare``, never saved: the (Cin or 2 Cin, s Cout) matrix, the bias of each of the
        # s output samples (s Cout,), and the bias in float32 for a SnakeBeta after it to add
        self.register_buffer("matrix", torch.empty(0), persistent=False)
        self.register_buffer("bias_s", torch.empty(0), persistent=False)
        self.register_buffer("bias32", torch.empty(0), persistent=False)

    @torch.no_grad()
    def prepare(self) -> None:
        w, s = self.conv.weight, self.stride  # (Cin, Cout, k)
        taps = [w[:, :, j * s : (j + 1) * s].permute(0, 2, 1).reshape(self.cin, s * self.cout) for j in range(self.prev + 1)]
        self.matrix = torch.cat(taps).contiguous()
        bias = self.conv.bias if self.conv.bias is not None else w.new_zeros(self.cout)
        self.bias_s = bias.repeat(s).contiguous()
        self.bias32 = bias.detach().to(torch.float32, copy=True)

    def forward(self, x: Tensor) -> Tensor:
        """k = s: x (B, T, Cin) -> (B, s T, Cout), bias added."""
        b, t, _ = x.shape
        return torch.addmm(self.bias_s, x.reshape(b * t, -1), self.matrix).view(b, t * self.stride, self.cout)

    def run_pair(self, pair: Tensor) -> Tensor:
        """k = 2s: pair (B, T, 2 Cin) of [x_t, x_{t-1}] -> (B, s T, Cout), without the bias (``bias32``)."""
        b, t, _ = pair.shape
        return (pair.view(b * t, -1) @ self.matrix).view(b, t * self.stride, self.cout)


class SnakeBeta(nn.Module):
    """x + 1 / (exp(beta) + 1e-9) * sin(x * exp(alpha))^2, per channel, on (B, T, C) activations, with
    the layer before's bias added first and the output laid out for the layer after (kernels/snake.py)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.beta = nn.Parameter(torch.zeros(channels))
        self._consts: tuple[Tensor, Tensor] | None = None  # (exp(alpha), 1 / (exp(beta) + 1e-9)) fp32
        self._kernel = False

    @torch.no_grad()
    def prepare(self, kernel: bool) -> None:
        """Run on the one-pass Triton kernel (kernels/snake.py) from now on, or on torch ops."""
        a = torch.exp(self.alpha.float()).contiguous()
        self._consts = (a, (1.0 / (torch.exp(self.beta.float()) + 1e-9)).contiguous())
        self._kernel = kernel

    def forward(
        self, x: Tensor, shift: Tensor | None = None, prefix: Tensor | None = None, pair: bool = False
    ) -> Tensor:
        if self._consts is None:
            raise RuntimeError("SnakeBeta.prepare() was not called")
        if self._kernel:
            from voicewire.kernels.snake import snake as fn
        else:  # torch ops only: no Triton needed (a CPU install without the kernels extra)
            from voicewire.kernels.reference import snake_reference as fn
        return fn(x, *self._consts, shift=shift, prefix=prefix, pair=pair)


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dwconv = CausalConv(dim, dim, 7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 1e-6))

    def forward(self, x: Tensor, io: StateIO) -> Tensor:
        h = self.pwconv2(F.gelu(self.pwconv1(self.norm(self.dwconv(x, io)))))
        return x + self.gamma * h


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int) -> None:
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv(dim, dim, 7, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv(dim, dim, 1)

    def forward(self, x: Tensor, shift: Tensor, io: StateIO) -> tuple[Tensor, Tensor]:
        """The residual stream is x + shift: x (B, T, C) as stored, shift (C,) float32 the biases of
        the layers that wrote it, added by the next SnakeBeta instead of one pass each."""
        c1 = self.conv1
        a1 = self.act1(x, shift, prefix=io.take(c1.history, c1.cin))  # conv1's whole input
        io.put(a1, c1.history, dim=1)
        a2 = self.act2(c1.run(a1, cudnn=io.cudnn_convs), c1.bias32)
        b, t, c = x.shape
        # the residual add inside the GEMM, in place: x is not read again, and an out-of-place addmm
        # first copies its input into the output (a pass over the largest activations, ~5% of a call)
        out = x.reshape(b * t, c)
        out.addmm_(a2.reshape(b * t, c), self.conv2.w4)
        return out.view(b, t, c), shift + self.conv2.bias32


class DecoderBlock(nn.Module):
    """SnakeBeta -> upsampling transposed conv (C -> C/2, x rate) -> 3 residual units."""

    def __init__(self, cin: int, rate: int) -> None:
        super().__init__()
        cout = cin // 2
        self.block = nn.ModuleList(
            [SnakeBeta(cin), CausalTransConv(cin, cout, 2 * rate, rate)]
            + [ResidualUnit(cout, d) for d in (1, 3, 9)]
        )

    def forward(self, x: Tensor, shift: Tensor, io: StateIO) -> tuple[Tensor, Tensor]:
        snake, up, *units = self.block
        up = cast(CausalTransConv, up)
        pair = snake(x, shift, prefix=io.take(1, up.cin), pair=True)  # (B, T, 2 Cin): [x_t, x_{t-1}]
        io.put_rows(_last_valid(pair, up.cin, io))
        x, shift = up.run_pair(pair), up.bias32
        for unit in units:
            x, shift = unit(x, shift, io)
        return x, shift


def _last_valid(pair: Tensor, cin: int, io: StateIO) -> Tensor:
    """The step a pair's next call needs as x_{-1}: x_t of the row's last valid step, or for a row with
    no valid frame the x_{-1} it was given (step 0's second half) -> (B, 1, Cin)."""
    b, t, _ = pair.shape
    if io.n_valid is None:
        return pair[:, -1:, :cin]
    valid = io.n_valid * (t // io.frames)  # this layer runs at t / frames steps per frame
    halves = pair.view(b, 2 * t, cin)  # [x_0, x_-1, x_1, x_0, ...]
    index = torch.where(valid > 0, 2 * valid - 2, torch.ones_like(valid))
    return halves.gather(1, index.view(b, 1, 1).expand(b, 1, cin))


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
        self._conv_kernel_min_frames = 0
        self.state_width = 0

    @torch.no_grad()
    def prepare(
        self, kernels: bool | None = None, conv_kernel: bool | None = False, conv_kernel_min_frames: int = 0
    ) -> None:
        """Fold the RVQ normalization and output projections into one (Q, V, codebook_dim) table and
        each transformer layer's weights (``CodecLayer``), and run the SnakeBeta activations, RMS norms
        and SwiGLU activations on their Triton kernels (``kernels``; None = on CUDA) or torch ops, and
        the k > 1 convs on kernels/conv1d.py (``conv_kernel``; None = on CUDA) or cuDNN; with the
        kernel, calls of fewer than ``conv_kernel_min_frames`` rows x frames still run on cuDNN.

        Call after loading weights (the model does), and again after changing their dtype or device.
        Sum-then-project in the reference becomes project-then-sum here, and a layer scale multiplies
        its projection's weight instead of its output: the same math, float-rounding differences.
        """
        kernel = self.codebook_sum.is_cuda if kernels is None else kernels
        conv_kernel = self.codebook_sum.is_cuda if conv_kernel is None else conv_kernel
        self._conv_kernel_min_frames = conv_kernel_min_frames
        for m in self.modules():
            if isinstance(m, SnakeBeta):
                m.prepare(kernel)
            elif isinstance(m, CausalConv):
                m.prepare(conv_kernel)
            elif isinstance(m, CausalTransConv):
                m.prepare()
            elif isinstance(m, CodecLayer):
                m.prepare(kernel)
        self.pre_transformer.norm.fn = norm_fn(kernel)
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
        small = codes.shape[0] * t < self._conv_kernel_min_frames
        io = StateIO(state, codes.shape[0], state.dtype, state.device, t, n_valid, cudnn_convs=small)
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
        x = self._tables[rows, codes].sum(dim=1)  # (B, T, codebook_dim)
        x = self.pre_transformer(self.pre_conv(x, io), start, io)  # (B, T, latent)
        for stage in self.upsample:
            up, convnext = cast(nn.ModuleList, stage)  # [transposed conv, ConvNeXt]
            x = convnext(up(x), io)
        first, *blocks, snake, last = self.decoder
        first, last = cast(CausalConv, first), cast(CausalConv, last)
        x, shift = first(x, io, bias=False), first.bias32
        for block in blocks:
            x, shift = block(x, shift, io)
        xx = snake(x, shift, prefix=io.take(last.history, last.cin))
        io.put(xx, last.history, dim=1)
        return last.run(xx, bias=True, cudnn=io.cudnn_convs)[..., 0].clamp(-1.0, 1.0).to(torch.float32)
