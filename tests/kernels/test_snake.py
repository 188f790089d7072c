"""The one-pass SnakeBeta kernel against the codec's torch ops, and the codec decoder on it."""

from __future__ import annotations

import pytest
import torch

from tests.kernels.common import needs_interpreter, rel_err
from voicewire.engine.qwen3.codec_decoder import CodecDecoder, SnakeBeta
from voicewire.engine.qwen3.presets import preset
from voicewire.kernels.snake import snake


def _module(channels: int, device: str, dtype: torch.dtype, seed: int) -> SnakeBeta:
    g = torch.Generator().manual_seed(seed)
    m = SnakeBeta(channels)
    with torch.no_grad():  # log-scale parameters around the trained range
        m.alpha.copy_(torch.randn(channels, generator=g) * 0.5)
        m.beta.copy_(torch.randn(channels, generator=g) * 0.5)
    return m.to(device, dtype)


@pytest.mark.parametrize("shape", [(2, 6, 50), (1, 96, 1920), (3, 5, 1)])
def test_snake_kernel_matches_the_torch_ops(device: str, shape: tuple[int, int, int]) -> None:
    for dtype in (torch.float32,) if device == "cpu" else (torch.float32, torch.bfloat16):
        m = _module(shape[1], device, dtype, seed=shape[2])
        x = (torch.randn(*shape, generator=torch.Generator().manual_seed(1)) * 3).to(device, dtype)
        ref = m(x.float().to(dtype))  # the torch ops, rounded per op in dtype
        m.prepare(kernel=True)
        out = m(x)
        assert out.shape == x.shape and out.dtype == dtype and out.is_contiguous()
        # fp32: the same math; bf16: the kernel rounds once where the torch ops round five times
        assert rel_err(out, ref) < (1e-6 if dtype == torch.float32 else 1e-2), (dtype, rel_err(out, ref))


def test_snake_kernel_reads_strided_input(device: str) -> None:
    """The transposed conv's output is a slice along time: non-contiguous input, contiguous output."""
    m = _module(4, device, torch.float32, seed=2)
    big = torch.randn(2, 4, 40, generator=torch.Generator().manual_seed(3)).to(device)
    x = big[..., 3:33]
    ref = m(x)
    m.prepare(kernel=True)
    assert rel_err(m(x), ref) < 1e-6
    assert rel_err(m(big.transpose(1, 2).contiguous().transpose(1, 2)), m(big)) == 0.0


@needs_interpreter
def test_snake_kernel_rejects_bad_inputs() -> None:
    a = torch.ones(4)
    with pytest.raises(ValueError, match="B, C, T"):
        snake(torch.zeros(4, 5), a, a)
    with pytest.raises(ValueError, match="inv_b"):
        snake(torch.zeros(1, 4, 5), a, torch.ones(3))
    with pytest.raises(ValueError, match="float32"):
        snake(torch.zeros(1, 4, 5), a.double(), a)
    with pytest.raises(TypeError):
        snake(torch.zeros(1, 4, 5, dtype=torch.int32), a, a)


def test_codec_on_the_snake_kernel_decodes_like_the_torch_ops(device: str) -> None:
    """The whole streaming decoder (tiny shapes, fp32) with every SnakeBeta on the kernel."""
    torch.manual_seed(0)
    codec = CodecDecoder(preset("tiny").codec).to(device)
    with torch.no_grad():
        for p in codec.parameters():
            p.normal_(0, 0.05)
    codes = torch.randint(0, codec.cfg.codebook_size, (2, codec.cfg.num_quantizers, 3), device=device)
    codec.prepare(snake_kernel=False)
    ref = codec.decode(codes)
    codec.prepare(snake_kernel=True)
    assert rel_err(codec.decode(codes), ref) < 1e-5
