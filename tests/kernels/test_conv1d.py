"""The time-major implicit-GEMM conv against torch's conv1d, and the codec decoder on it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.kernels.common import REL_TOL, needs_interpreter, rel_err, skip_unsupported, tiny_codec
from voicewire.kernels.conv1d import conv1d_tm, stack_taps


def _reference(xx: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dilation: int) -> torch.Tensor:
    y = F.conv1d(xx.double().transpose(1, 2), weight.double(), None if bias is None else bias.double(), dilation=dilation)
    return y.transpose(1, 2)


# (B, T, Cin, Cout, K, dilation): the codec's shapes in small (widths that 64 and 32 divide and not,
# its last conv's single output channel, a dilation of 9 with one new step, one row)
SHAPES = [
    (2, 5, 64, 40, 7, 3),
    (3, 1, 96, 1, 7, 9),
    (1, 37, 24, 48, 7, 1),
    (2, 4, 32, 96, 3, 1),
]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_conv_matches_torch(device: str, shape: tuple[int, ...], with_bias: bool, dtype: torch.dtype) -> None:
    skip_unsupported(device, dtype)
    b, t, cin, cout, k, d = shape
    g = torch.Generator().manual_seed(sum(shape))
    xx = torch.randn(b, t + (k - 1) * d, cin, generator=g).to(device, dtype)
    weight = (torch.randn(cout, cin, k, generator=g) / (cin * k) ** 0.5).to(device, dtype)
    bias = torch.randn(cout, generator=g).to(device, dtype) if with_bias else None
    out = conv1d_tm(xx, stack_taps(weight), k, d, bias)
    assert out.shape == (b, t, cout) and out.dtype == dtype and out.is_contiguous()
    assert rel_err(out, _reference(xx, weight, bias, d)) < REL_TOL[dtype]


@pytest.mark.parametrize("shape", [(2, 5, 64, 7, 1), (1, 9, 24, 7, 3), (3, 1, 96, 7, 9)])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_depthwise_conv_matches_torch(
    device: str, shape: tuple[int, ...], with_bias: bool, dtype: torch.dtype
) -> None:
    b, t, c, k, d = shape
    g = torch.Generator().manual_seed(sum(shape))
    xx = torch.randn(b, t + (k - 1) * d, c, generator=g).to(device, dtype)
    weight = (torch.randn(c, 1, k, generator=g) / k**0.5).to(device, dtype)
    bias = torch.randn(c, generator=g).to(device, dtype) if with_bias else None
    out = conv1d_tm(xx, stack_taps(weight), k, d, bias, depthwise=True)
    ref = F.conv1d(
        xx.double().transpose(1, 2),
        weight.double(),
        None if bias is None else bias.double(),
        dilation=d,
        groups=c,
    ).transpose(1, 2)
    assert out.shape == (b, t, c) and out.dtype == dtype and out.is_contiguous()
    assert rel_err(out, ref) < REL_TOL[dtype]


@pytest.mark.parametrize("tile", [(16, 16, 16), (64, 32, 32)])
def test_conv_gives_the_same_at_other_tiles(device: str, tile: tuple[int, int, int]) -> None:
    """Tiles smaller than the channels, the positions and a row (the masks and loops at their edges)."""
    g = torch.Generator().manual_seed(11)
    xx = torch.randn(3, 40 + 6 * 3, 48, generator=g).to(device)
    weight = (torch.randn(40, 48, 7, generator=g) / (48 * 7) ** 0.5).to(device)
    taps = stack_taps(weight)
    assert rel_err(conv1d_tm(xx, taps, 7, 3, tile=tile), _reference(xx, weight, None, 3)) < 1e-5


def test_rows_do_not_read_each_other(device: str) -> None:
    """Output positions of one batch row read only that row's input: a row of zeros stays zeros
    beside rows of large values, whatever tile the positions share."""
    xx = torch.randn(3, 6 + 6 * 3, 32, generator=torch.Generator().manual_seed(7)).to(device) * 100
    xx[1] = 0
    weight = torch.randn(16, 32, 7, generator=torch.Generator().manual_seed(8)).to(device)
    out = conv1d_tm(xx, stack_taps(weight), 7, 3)
    assert torch.count_nonzero(out[1]) == 0 and torch.count_nonzero(out[0]) > 0


@needs_interpreter
def test_conv_rejects_bad_inputs() -> None:
    taps = torch.zeros(7 * 4, 8)
    with pytest.raises(ValueError, match="contiguous"):
        conv1d_tm(torch.zeros(1, 4, 10).transpose(1, 2), taps, 7)
    with pytest.raises(ValueError, match="taps"):
        conv1d_tm(torch.zeros(1, 10, 5), taps, 7)
    with pytest.raises(ValueError, match="history"):
        conv1d_tm(torch.zeros(1, 5, 4), taps, 7)
    with pytest.raises(ValueError, match="taps"):
        conv1d_tm(torch.zeros(1, 10, 4), torch.zeros(7, 5), 7, depthwise=True)
    with pytest.raises(ValueError, match="bias"):
        conv1d_tm(torch.zeros(1, 10, 4), taps, 7, bias=torch.zeros(3))
    with pytest.raises(TypeError):
        conv1d_tm(torch.zeros(1, 10, 4, dtype=torch.int32), taps.int(), 7)


def test_codec_on_the_conv_kernel_decodes_like_cudnn(device: str) -> None:
    """The whole streaming decoder (tiny shapes, fp32), its convs on the kernels: the offline
    decode and a stream of two chunks, against the same decoder on torch's convs."""
    codec, codes = tiny_codec(device, frames=5)
    codec.prepare(kernels=False)
    ref = codec.decode(codes)
    codec.prepare(kernels=False, conv_kernel=True)
    assert rel_err(codec.decode(codes), ref) < 1e-5
    state, start = codec.fresh_state(2)
    first, state, start = codec.stream(codes[..., :2], state, start)
    rest, _, _ = codec.stream(codes[..., 2:], state, start)
    assert rel_err(torch.cat((first, rest), dim=1), ref) < 1e-5


def test_small_codec_calls_keep_cudnn(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the kernel prepared, a call of fewer rows x frames than ``conv_kernel_min_frames`` runs its
    convs on cuDNN and a larger one on the kernel; the stream over both equals the offline decode."""
    from voicewire.kernels import conv1d

    codec, codes = tiny_codec(device, frames=5)
    codec.prepare(kernels=False)
    ref = codec.decode(codes)
    codec.prepare(kernels=False, conv_kernel=True, conv_kernel_min_frames=6)
    launches: list[int] = []
    real = conv1d.conv1d_tm
    monkeypatch.setattr(conv1d, "conv1d_tm", lambda *a, **kw: launches.append(1) or real(*a, **kw))
    state, start = codec.fresh_state(2)
    first, state, start = codec.stream(codes[..., :2], state, start)  # 2 rows x 2 frames
    assert not launches
    rest, _, _ = codec.stream(codes[..., 2:], state, start)  # 2 x 3
    assert launches
    assert rel_err(torch.cat((first, rest), dim=1), ref) < 1e-5
