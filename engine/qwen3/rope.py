"""Rotary position embeddings: the plain 1-D form, and the talker's interleaved multimodal form.

The talker was trained with multimodal RoPE (MRoPE): the 64 rotation frequencies of a 128-wide head
are split into (temporal, height, width) sections [24, 20, 20], interleaved (frequency f belongs to
section f % 3 while that section lasts), each rotated by its own position stream. A TTS prompt is
text and codec tokens only, so the official code feeds the same position to all three streams, and
then every frequency sees the same angle: MRoPE is exactly the 1-D RoPE. The serving path therefore
uses one cos/sin table indexed by position; :func:`mrope_cos_sin` is the general form, kept so a test
shows the two agree (and for the day a prompt carries a real 3-D position).
"""

from __future__ import annotations

import torch
from torch import Tensor


def inv_freq(head_dim: int, theta: float) -> Tensor:
    """(head_dim // 2,) float32 rotation frequencies, theta ** (-2i / head_dim)."""
    exponent = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
    return 1.0 / (theta**exponent)


def cos_sin(positions: Tensor, freqs: Tensor) -> tuple[Tensor, Tensor]:
    """float32 cos/sin for integer positions (any shape P) -> (*P, head_dim), halves duplicated."""
    angles = positions.to(torch.float32)[..., None] * freqs.to(positions.device)  # (*P, hd/2)
    emb = torch.cat((angles, angles), dim=-1)
    return emb.cos(), emb.sin()


def mrope_cos_sin(
    positions_thw: Tensor, freqs: Tensor, section: tuple[int, ...], interleaved: bool = True
) -> tuple[Tensor, Tensor]:
    """Multimodal RoPE for (3, *P) positions -> (*P, head_dim) float32 cos/sin.

    ``interleaved``: frequency f takes stream f % 3 while f < 3 * section[f % 3] (stream 0 beyond);
    otherwise the sections are contiguous blocks [t..., h..., w...].
    """
    half = freqs.numel()
    if sum(section) != half:
        raise ValueError(f"mrope section {section} does not cover {half} frequencies")
    angles = positions_thw.to(torch.float32)[..., None] * freqs.to(positions_thw.device)  # (3, *P, half)
    f = torch.arange(half, device=positions_thw.device)
    if interleaved:
        stream = f % 3
        stream = torch.where(f < 3 * torch.tensor(section, device=f.device)[stream], stream, 0)
    else:
        stream = torch.repeat_interleave(
            torch.arange(3, device=f.device), torch.tensor(section, device=f.device)
        )
    picked = angles.gather(0, stream.expand_as(angles[:1]).clone())[0]  # (*P, half)
    emb = torch.cat((picked, picked), dim=-1)
    return emb.cos(), emb.sin()


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Apply RoPE to x (B, H, T, hd) with cos/sin (B, T, hd) in x's dtype."""
    c, s = cos[:, None], sin[:, None]
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * c + rotated * s
