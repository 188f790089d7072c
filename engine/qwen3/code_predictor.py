"""The code predictor (MTP): fills codebooks 1..15 of a frame from the talker's last hidden state.

Per frame it runs a fresh 16-position sequence, batched over the streams of the step:

    position 0: the talker's final-norm hidden state of this step
    position 1: the embedding of codebook 0 (the talker's sampled code, talker codec table)
    position j+1: the embedding of codebook j (its own table j-1), j = 1..14

and the head of pass j (j = 0..14) predicts codebook j+1 from the last position. Inputs are in the
talker's width; ``small_to_mtp_projection`` maps them to the predictor's width when they differ
(1.7B: 2048 -> 1024; 0.6B: identity). Fifteen dependent passes per frame: this loop, not the talker,
is most of the per-frame launch count (peer-baseline.md), so it is the first CUDA-graph target.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from .config import CodePredictorConfig
from .layers import ContiguousKV, RMSNorm, decoder_layers
from .rope import cos_sin, inv_freq

# pick(codebook index 1..15, logits (B, vocab) float32) -> codes (B,) long
Pick = Callable[[int, Tensor], Tensor]


class CodePredictor(nn.Module):
    rope_freqs: Tensor

    def __init__(self, cfg: CodePredictorConfig, talker_hidden: int) -> None:
        super().__init__()
        self.cfg = cfg
        n = cfg.num_code_groups - 1
        self.layers = decoder_layers(cfg)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.codec_embedding = nn.ModuleList(nn.Embedding(cfg.vocab_size, talker_hidden) for _ in range(n))
        self.lm_head = nn.ModuleList(nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False) for _ in range(n))
        self.small_to_mtp_projection: nn.Module = (
            nn.Linear(talker_hidden, cfg.hidden_size, bias=True)
            if talker_hidden != cfg.hidden_size
            else nn.Identity()
        )
        self.register_buffer("rope_freqs", inv_freq(cfg.head_dim, cfg.rope_theta), persistent=False)

    def predict(self, talker_hidden: Tensor, code0_embed: Tensor, pick: Pick) -> Tensor:
        """talker_hidden, code0_embed: (B, H_talker) -> codebooks 1..15 as (B, 15) long."""
        b = talker_hidden.shape[0]
        n = self.cfg.num_code_groups - 1
        dev, dt = talker_hidden.device, talker_hidden.dtype
        kv = ContiguousKV(len(self.layers), b, self.cfg.num_kv_heads, n + 1, self.cfg.head_dim, dt, dev)
        x = torch.stack((talker_hidden, code0_embed), dim=1)  # (B, 2, H_talker)
        codes: list[Tensor] = []
        for j in range(n):
            h = self.small_to_mtp_projection(x)  # (B, T, H)
            t = h.shape[1]
            kv.begin(t)
            positions = torch.arange(kv.start, kv.length, device=dev).expand(b, t)
            cos, sin = cos_sin(positions, self.rope_freqs)
            cos, sin = cos.to(dt), sin.to(dt)
            # only the 2-position first pass needs a mask; later passes see every earlier position
            mask = torch.ones(t, t, dtype=torch.bool, device=dev).tril()[None, None] if t > 1 else None
            for layer in self.layers:
                h = layer(h, cos, sin, kv, mask)
            kv.advance()
            logits = self.lm_head[j](self.norm(h[:, -1])).to(torch.float32)  # (B, vocab)
            code = pick(j + 1, logits)
            codes.append(code)
            if j + 1 < n:
                x = self.codec_embedding[j](code)[:, None]  # (B, 1, H_talker)
        return torch.stack(codes, dim=1)
