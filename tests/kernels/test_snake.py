"""The one-pass SnakeBeta kernel against its torch reference in every layout, and the codec on it."""

from __future__ import annotations

import pytest
import torch

from tests.kernels.common import needs_interpreter, rel_err, tiny_codec
from voicewire.kernels.snake import snake, snake_reference


def _consts(channels: int, device: str, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)  # log-scale parameters around the trained range
    alpha, beta = torch.randn(channels, generator=g) * 0.5, torch.randn(channels, generator=g) * 0.5
    shift = torch.randn(channels, generator=g) * 0.1
    a, inv_b = torch.exp(alpha), 1.0 / (torch.exp(beta) + 1e-9)
    return a.to(device), inv_b.to(device), shift.to(device)


def test_reference_is_snake_beta_of_the_shifted_input() -> None:
    a, inv_b, shift = _consts(5, "cpu", 0)
    x = torch.randn(2, 7, 5, generator=torch.Generator().manual_seed(1)) * 3
    v = x + shift
    want = v + inv_b * torch.sin(v * a) ** 2
    assert rel_err(snake_reference(x, a, inv_b, shift), want) < 1e-6
    pre = torch.randn(2, 1, 5)
    pair = snake_reference(x, a, inv_b, shift, prefix=pre, pair=True)
    assert torch.equal(pair[:, :, :5], snake_reference(x, a, inv_b, shift))
    assert torch.equal(pair[:, 0, 5:], pre[:, 0]) and torch.equal(pair[:, 1:, 5:], pair[:, :-1, :5])


@pytest.mark.parametrize("shape", [(2, 50, 6), (1, 1920, 96), (3, 1, 5)])
@pytest.mark.parametrize("mode", ["plain", "shift", "prefix", "pair"])
def test_snake_kernel_matches_the_reference(device: str, shape: tuple[int, int, int], mode: str) -> None:
    b, t, c = shape
    a, inv_b, shift = _consts(c, device, seed=t)
    for dtype in (torch.float32,) if device == "cpu" else (torch.float32, torch.bfloat16):
        g = torch.Generator().manual_seed(2)
        x = (torch.randn(*shape, generator=g) * 3).to(device, dtype)
        prefix = None
        if mode in ("prefix", "pair"):
            prefix = torch.randn(b, 1 if mode == "pair" else 6, c, generator=g).to(device, dtype)
        kw = {"shift": shift if mode != "plain" else None, "prefix": prefix, "pair": mode == "pair"}
        out, ref = snake(x, a, inv_b, **kw), snake_reference(x, a, inv_b, **kw)
        assert out.shape == ref.shape and out.dtype == dtype and out.is_contiguous()
        # the same fp32 math and one rounding on both sides: equal up to the sin implementations
        assert rel_err(out, ref) < (1e-6 if dtype == torch.float32 else 1e-2), (dtype, rel_err(out, ref))


def test_snake_kernel_sin_holds_for_large_arguments(device: str) -> None:
    """The kernel reduces x * a by pi itself: arguments of up to ~1e4 (far past the trained range)
    still give sin^2 to ~1e-6, here with v = x (no shift) and inv_b = 1 so the sin term is exposed."""
    c = 64
    g = torch.Generator().manual_seed(5)
    a = torch.logspace(-2, 2, c).to(device)
    x = (torch.rand(3, 200, c, generator=g) * 200 - 100).to(device)
    ones = torch.ones(c, device=device)
    got = snake(x, a, ones) - x
    want = torch.sin((x * a).double()) ** 2  # of the float32 product, as the kernel takes it
    assert float((got.double() - want).abs().max()) < 2e-5  # |x| <= 100 rounds y = x + s to ~4e-6
    assert got.min() > -1e-5 and got.max() < 1 + 2e-5


def test_snake_kernel_reads_strided_inputs(device: str) -> None:
    """x a slice along time, the prefix a view into a flat (B, N) state row: both batch-strided."""
    a, inv_b, shift = _consts(4, device, seed=3)
    g = torch.Generator().manual_seed(4)
    big = torch.randn(2, 40, 4, generator=g).to(device)
    flat = torch.randn(2, 50, generator=g).to(device)
    x, prefix = big[:, 3:33], flat.narrow(1, 10, 12).view(2, 3, 4)
    out = snake(x, a, inv_b, shift, prefix=prefix)
    assert rel_err(out, snake_reference(x.contiguous(), a, inv_b, shift, prefix=prefix.contiguous())) < 1e-6
    assert torch.equal(out[:, :3], prefix)


@needs_interpreter
def test_snake_kernel_rejects_bad_inputs() -> None:
    a = torch.ones(4)
    with pytest.raises(ValueError, match="B, T, C"):
        snake(torch.zeros(4, 5), a, a)
    with pytest.raises(ValueError, match="inv_b"):
        snake(torch.zeros(1, 5, 4), a, torch.ones(3))
    with pytest.raises(ValueError, match="float32"):
        snake(torch.zeros(1, 5, 4), a.double(), a)
    with pytest.raises(TypeError):
        snake(torch.zeros(1, 5, 4, dtype=torch.int32), a, a)
    with pytest.raises(ValueError, match="pair"):
        snake(torch.zeros(1, 5, 4), a, a, prefix=torch.zeros(1, 2, 4), pair=True)
    with pytest.raises(ValueError, match="channel stride"):
        snake(torch.zeros(1, 4, 5).transpose(1, 2), a, a)


def test_codec_on_its_kernels_decodes_like_the_torch_ops(device: str) -> None:
    """The whole streaming decoder (tiny shapes, fp32) with every SnakeBeta, RMS norm and SwiGLU
    activation on its kernel."""
    codec, codes = tiny_codec(device, frames=3)
    codec.prepare(kernels=False)
    ref = codec.decode(codes)
    codec.prepare(kernels=True)
    assert rel_err(codec.decode(codes), ref) < 1e-5
