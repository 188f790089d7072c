"""The Base checkpoints' speaker encoder: reference audio -> one x-vector (ECAPA-TDNN).

    pcm (S,) 24 kHz float32
      -> log-mel (T, 128): |STFT| (n_fft 1024, hop 256, Hann 1024, reflect-padded by 384 a side,
         no centring) through a Slaney mel bank 0..12 kHz, log(max(x, 1e-5))
      -> TDNN (T, 512) -> 3 x SE-Res2Net (T, 512) each -> concat (T, 1536) -> TDNN (T, 1536)
      -> attentive statistics pooling (3072,) -> 1x1 conv -> x-vector (enc_dim,) = talker width

Every convolution pads "same" by reflection, as the checkpoint was trained. Parameter names follow
the official checkpoint below ``speaker_encoder.`` (``blocks.1.res2net_block.blocks.0.conv``...),
so weights.py loads it by prefix. The mel bank is computed here (the package asks librosa for it);
the Slaney formulas are short and this keeps librosa off the serving machine.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import SpeakerEncoderConfig

N_FFT = 1024
HOP = 256
WINDOW = 1024
MEL_FMAX_HZ = 12_000.0
LOG_FLOOR = 1e-5
POOL_EPS = 1e-12


# --- mel front end -----------------------------------------------------------------------------
def _hz_to_mel(hz: np.ndarray) -> np.ndarray:
    """Slaney's scale: linear below 1 kHz (3 mels per 200 Hz), logarithmic above (27 mels per 6.4x)."""
    mel = hz / (200.0 / 3)
    log_step = math.log(6.4) / 27.0
    return np.where(hz >= 1000.0, 15.0 + np.log(np.maximum(hz, 1e-10) / 1000.0) / log_step, mel)


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    log_step = math.log(6.4) / 27.0
    return np.where(mel >= 15.0, 1000.0 * np.exp(log_step * (mel - 15.0)), mel * (200.0 / 3))


def mel_filterbank(sample_rate_hz: int, n_mels: int, fmax_hz: float = MEL_FMAX_HZ) -> np.ndarray:
    """(n_mels, N_FFT // 2 + 1) float32 triangles on the Slaney scale, area-normalized (Slaney norm).

    Built in float64 and stored in float32 at the same two points as librosa.filters.mel, so the
    bank matches the package's to the last bit or two.
    """
    fft_hz = np.fft.rfftfreq(N_FFT, d=1.0 / sample_rate_hz)
    edges_hz = _mel_to_hz(np.linspace(_hz_to_mel(np.array(0.0)), _hz_to_mel(np.array(fmax_hz)), n_mels + 2))
    widths = np.diff(edges_hz)
    ramps = edges_hz[:, None] - fft_hz[None, :]
    bank = np.zeros((n_mels, fft_hz.size), dtype=np.float32)
    for i in range(n_mels):
        rising = -ramps[i] / widths[i]
        falling = ramps[i + 2] / widths[i + 1]
        bank[i] = np.maximum(0.0, np.minimum(rising, falling))
    bank *= (2.0 / (edges_hz[2 : n_mels + 2] - edges_hz[:n_mels]))[:, None]
    return bank


def log_mel(pcm: Tensor, bank: Tensor) -> Tensor:
    """pcm (B, S) float32 -> log-mel (B, T, n_mels), T = (S - 256) // 256 + 1 (S >= 641)."""
    pad = (N_FFT - HOP) // 2
    x = F.pad(pcm[:, None], (pad, pad), mode="reflect")[:, 0]
    window = torch.hann_window(WINDOW, device=pcm.device, dtype=pcm.dtype)
    spec = torch.stft(x, N_FFT, HOP, WINDOW, window, center=False, return_complex=True)  # (B, F, T)
    mag = torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + 1e-9)
    return torch.log(torch.clamp(bank @ mag, min=LOG_FLOOR)).transpose(1, 2)


# --- ECAPA-TDNN --------------------------------------------------------------------------------
def _conv(c_in: int, c_out: int, kernel: int = 1, dilation: int = 1) -> nn.Conv1d:
    return nn.Conv1d(c_in, c_out, kernel, dilation=dilation, padding="same", padding_mode="reflect")


class TDNN(nn.Module):
    """conv + ReLU (a "time-delay" layer)."""

    def __init__(self, c_in: int, c_out: int, kernel: int, dilation: int) -> None:
        super().__init__()
        self.conv = _conv(c_in, c_out, kernel, dilation)

    def forward(self, x: Tensor) -> Tensor:
        return F.relu(self.conv(x))


class Res2Net(nn.Module):
    """Channels in ``scale`` groups; group i > 0 is convolved after adding group i-1's output, so the
    receptive field grows group by group inside one block. Group 0 passes through."""

    def __init__(self, channels: int, scale: int, kernel: int, dilation: int) -> None:
        super().__init__()
        width = channels // scale
        self.scale = scale
        self.blocks = nn.ModuleList(TDNN(width, width, kernel, dilation) for _ in range(scale - 1))

    def forward(self, x: Tensor) -> Tensor:
        parts = list(torch.chunk(x, self.scale, dim=1))
        out = [parts[0]]
        for i, block in enumerate(self.blocks):
            inp = parts[i + 1] if i == 0 else parts[i + 1] + out[-1]
            out.append(block(inp))
        return torch.cat(out, dim=1)


class SqueezeExcitation(nn.Module):
    """Per-channel gates from the time average: x * sigmoid(W2 relu(W1 mean_t x))."""

    def __init__(self, channels: int, bottleneck: int) -> None:
        super().__init__()
        self.conv1 = _conv(channels, bottleneck)
        self.conv2 = _conv(bottleneck, channels)

    def forward(self, x: Tensor) -> Tensor:
        gate = torch.sigmoid(self.conv2(F.relu(self.conv1(x.mean(dim=2, keepdim=True)))))
        return x * gate


class SERes2NetBlock(nn.Module):
    def __init__(self, channels: int, scale: int, se_channels: int, kernel: int, dilation: int) -> None:
        super().__init__()
        self.tdnn1 = TDNN(channels, channels, 1, 1)
        self.res2net_block = Res2Net(channels, scale, kernel, dilation)
        self.tdnn2 = TDNN(channels, channels, 1, 1)
        self.se_block = SqueezeExcitation(channels, se_channels)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.se_block(self.tdnn2(self.res2net_block(self.tdnn1(x))))


def _weighted_stats(x: Tensor, w: Tensor) -> tuple[Tensor, Tensor]:
    """x (B, C, T), weights (B, C|1, T) summing to 1 over T -> mean, std (B, C)."""
    mean = (w * x).sum(dim=2)
    var = (w * (x - mean[..., None]).pow(2)).sum(dim=2)
    return mean, torch.sqrt(var.clamp(min=POOL_EPS))


class AttentiveStatsPool(nn.Module):
    """Mean and std over time, weighted by a per-channel softmax attention that itself sees the
    utterance's global mean and std (ECAPA's "context-dependent" pooling)."""

    def __init__(self, channels: int, attention_channels: int) -> None:
        super().__init__()
        self.tdnn = TDNN(channels * 3, attention_channels, 1, 1)
        self.conv = _conv(attention_channels, channels)

    def forward(self, x: Tensor) -> Tensor:
        """x (B, C, T) -> (B, 2C, 1)."""
        t = x.shape[2]
        uniform = torch.full((1, 1, t), 1.0 / t, dtype=x.dtype, device=x.device)
        mean, std = _weighted_stats(x, uniform)
        context = torch.cat((x, mean[..., None].expand_as(x), std[..., None].expand_as(x)), dim=1)
        attn = torch.softmax(self.conv(torch.tanh(self.tdnn(context))), dim=2)
        mean, std = _weighted_stats(x, attn)
        return torch.cat((mean, std), dim=1)[..., None]


class SpeakerEncoder(nn.Module):
    def __init__(self, cfg: SpeakerEncoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        ch, ks, ds = cfg.enc_channels, cfg.enc_kernel_sizes, cfg.enc_dilations
        blocks: list[nn.Module] = [TDNN(cfg.mel_dim, ch[0], ks[0], ds[0])]
        blocks += [
            SERes2NetBlock(ch[i], cfg.enc_res2net_scale, cfg.enc_se_channels, ks[i], ds[i])
            for i in range(1, len(ch) - 1)
        ]
        self.blocks = nn.ModuleList(blocks)
        self.mfa = TDNN(ch[-1], ch[-1], ks[-1], ds[-1])
        self.asp = AttentiveStatsPool(ch[-1], cfg.enc_attention_channels)
        self.fc = _conv(ch[-1] * 2, cfg.enc_dim)
        # float32 whatever the module's dtype (not a buffer, so .to(bf16) leaves it alone)
        self.mel_bank = torch.from_numpy(mel_filterbank(cfg.sample_rate_hz, cfg.mel_dim))

    def forward(self, mels: Tensor) -> Tensor:
        """log-mel (B, T, mel_dim) -> x-vectors (B, enc_dim)."""
        x = mels.transpose(1, 2)
        outs = []
        for block in self.blocks:
            x = block(x)
            outs.append(x)
        x = self.mfa(torch.cat(outs[1:], dim=1))  # multi-layer aggregation of the SE-Res2Net outputs
        return self.fc(self.asp(x))[..., 0]

    @torch.no_grad()
    def embed(self, pcm: Tensor) -> Tensor:
        """pcm (S,) float32 at ``cfg.sample_rate_hz`` -> x-vector (enc_dim,) in the module's dtype.

        The mel features are computed in float32 on the module's device, then cast (as the package
        does: its features are float32 on the CPU, cast for the encoder)."""
        w = self.fc.weight
        mels = log_mel(pcm.to(device=w.device, dtype=torch.float32)[None], self.mel_bank.to(w.device))
        return self(mels.to(w.dtype))[0]
