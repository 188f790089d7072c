"""The codec transformer's layer as served (q|k|v and gate|up fused, layer scales folded into o and
down, residuals added in place) against the checkpoint's layer computed step by step."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from voicewire.engine.qwen3.codec_state import StateIO
from voicewire.engine.qwen3.codec_transformer import CodecLayer
from voicewire.engine.qwen3.layers import rms_norm
from voicewire.engine.qwen3.presets import preset
from voicewire.engine.qwen3.rope import cos_sin, inv_freq, rotate


def _reference(
    layer: CodecLayer,
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    mask: torch.Tensor,
    k_tail: torch.Tensor,
    v_tail: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The official layer's order of operations; mask boolean (B, 1, T, tail + T)."""
    a = layer.self_attn
    b, t, _ = x.shape
    h = rms_norm(x, layer.input_layernorm.weight, layer.input_layernorm.eps)
    q = a.q_proj(h).view(b, t, a.heads, a.head_dim).transpose(1, 2)
    k = a.k_proj(h).view(b, t, a.kv_heads, a.head_dim).transpose(1, 2)
    v = a.v_proj(h).view(b, t, a.kv_heads, a.head_dim).transpose(1, 2)
    q, k = rotate(q, cos, sin), rotate(k, cos, sin)
    k_all, v_all = torch.cat((k_tail, k), dim=2), torch.cat((v_tail, v), dim=2)
    out = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask)
    attn = a.o_proj(out.transpose(1, 2).reshape(b, t, -1))
    x = x + layer.self_attn_layer_scale.scale * attn
    mlp = layer.mlp
    h = rms_norm(x, layer.post_attention_layernorm.weight, layer.post_attention_layernorm.eps)
    x = x + layer.mlp_layer_scale.scale * mlp.down_proj(F.silu(mlp.gate_proj(h)) * mlp.up_proj(h))
    return x, k_all[:, :, -a.tail :], v_all[:, :, -a.tail :]


@pytest.mark.parametrize("bias", [False, True])
def test_served_layer_equals_the_checkpoint_layer(bias: bool) -> None:
    cfg = dataclasses.replace(preset("tiny").codec, attention_bias=bias)
    torch.manual_seed(0)
    layer = CodecLayer(cfg).eval()
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0, 0.2)
    layer.prepare(kernels=False)
    b, t, tail, kvh, hd = 2, 5, cfg.sliding_window - 1, cfg.num_kv_heads, cfg.head_dim
    x = torch.randn(b, t, cfg.hidden_size)
    start = torch.tensor([0, 30])
    q_pos = start[:, None] + torch.arange(t)
    k_pos = start[:, None] - tail + torch.arange(tail + t)
    diff = q_pos[:, :, None] - k_pos[:, None, :]
    allowed = ((diff >= 0) & (diff < cfg.sliding_window) & (k_pos[:, None, :] >= 0))[:, None]
    additive = torch.zeros(allowed.shape).masked_fill_(~allowed, float("-inf"))
    cos, sin = cos_sin(q_pos, inv_freq(hd, cfg.rope_theta))
    flat = torch.randn(b, 2 * kvh * tail * hd)  # the K tail's heads, then the V tail's
    io = StateIO(flat, b, torch.float32, torch.device("cpu"))

    with torch.no_grad():
        want, k_next, v_next = _reference(
            layer, x, cos, sin, allowed, *flat.view(b, 2 * kvh, tail, hd).split(kvh, dim=1)
        )
        got = layer(x.clone(), cos, sin, additive, io)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(
        io.next_flat(), torch.cat((k_next, v_next), dim=1).reshape(b, -1), rtol=0, atol=1e-6
    )
