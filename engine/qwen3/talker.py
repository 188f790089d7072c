"""The talker: a Qwen3 decoder over a dual-track input (codec track + text track), predicting codebook 0.

Each input position is the sum of a codec-track embedding and a text-track embedding (see prompt.py
for the prompt layout). After the prompt, step k feeds the frame just produced (the sum of its 16
code embeddings) plus the next text token's embedding, or the tts-eos embedding once, then the
tts-pad embedding when the text has run out. Text embeddings are 2048-wide and go through a SiLU MLP
(``text_projection``) to the talker width.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import TalkerConfig
from .layers import KVStore, RMSNorm, decoder_layers
from .rope import cos_sin, inv_freq


class TextProjection(nn.Module):
    def __init__(self, dim_in: int, hidden: int, dim_out: int) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(dim_in, hidden, bias=True)
        self.linear_fc2 = nn.Linear(hidden, dim_out, bias=True)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear_fc2(F.silu(self.linear_fc1(x)))


class Talker(nn.Module):
    rope_freqs: Tensor

    def __init__(self, cfg: TalkerConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.codec_embedding = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.text_embedding = nn.Embedding(cfg.text_vocab_size, cfg.text_hidden_size)
        self.text_projection = TextProjection(cfg.text_hidden_size, cfg.text_hidden_size, cfg.hidden_size)
        self.layers = decoder_layers(cfg)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.codec_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        # Plain RoPE: the prompt's three MRoPE position streams are equal (rope.py explains).
        self.register_buffer("rope_freqs", inv_freq(cfg.head_dim, cfg.rope_theta), persistent=False)

    def embed_text(self, ids: Tensor) -> Tensor:
        """Text-track embeddings: (*,) token ids -> (*, hidden)."""
        return self.text_projection(self.text_embedding(ids))

    def forward(self, x: Tensor, positions: Tensor, kv: KVStore, mask: Tensor | None) -> Tensor:
        """x (B, T, H) input embeddings at ``positions`` (B, T) -> final-norm hidden states (B, T, H)."""
        cos, sin = cos_sin(positions, self.rope_freqs)
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin, kv, mask)
        return self.norm(x)

    def logits(self, hidden: Tensor) -> Tensor:
        """(B, H) -> (B, vocab) float32 codebook-0 logits."""
        return self.codec_head(hidden).to(torch.float32)
