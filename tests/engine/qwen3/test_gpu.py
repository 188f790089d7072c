"""GPU checks (skipped without CUDA): fp32 equals the CPU, the real-size codec streams exactly, bf16 is close.

The full GPU report (parity with the official package in fp32 and bf16, speed) is
benchmarks/gpu_qwen3_check.py; these are the pytest-sized part. TF32 is switched off: fp32 must
mean fp32 for the 1e-5 / 1e-4 bounds.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch

from engine.config import ChunkSchedule
from engine.model import StreamParams
from engine.qwen3 import load_qwen3
from engine.qwen3.codec_decoder import CodecDecoder
from engine.qwen3.config import preset
from engine.qwen3.weights import build_modules, randomize

from .conftest import run_stream

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _no_tf32() -> Iterator[None]:
    old = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = old


def _stream_vs_offline(codec: CodecDecoder, n: int, schedule: ChunkSchedule) -> float:
    dev = next(codec.parameters()).device
    codes = torch.from_numpy(np.random.default_rng(0).integers(0, 2048, (2, 16, n))).to(dev)
    offline = codec.decode(codes)
    state, start = codec.fresh_state(2)
    pieces, t, i = [], 0, 0
    while t < n:
        k = min(schedule.frames_for(i), n - t)
        pcm, state, start = codec.stream(codes[..., t : t + k], state, start)
        pieces.append(pcm)
        t, i = t + k, i + 1
    return float((torch.cat(pieces, dim=1) - offline).abs().max())


def test_cuda_fp32_gives_the_cpu_codes_and_audio() -> None:
    params = StreamParams(voice="vivian", greedy=True, forced_frames=40, seed=0)
    text = ["The GPU speaks exactly like the CPU, frame for frame."]
    cpu = load_qwen3(None, "tiny", device="cpu", seed=4, max_seq_len=128)
    gpu = load_qwen3(None, "tiny", device="cuda", seed=4, max_seq_len=128)
    a, b = run_stream(cpu, 0, text, params), run_stream(gpu, 0, text, params)
    np.testing.assert_array_equal(a, b)
    wa = cpu.codec.decode(torch.from_numpy(a).T[None])[0].numpy()
    wb = gpu.codec.decode(torch.from_numpy(a).T[None].cuda())[0].cpu().numpy()
    np.testing.assert_allclose(wa, wb, rtol=0, atol=1e-4)


@pytest.mark.parametrize("size", ["tiny", "0.6b"])
def test_cuda_streaming_equals_offline(size: str, record_property: pytest.RecordProperty) -> None:
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 0.05)):
        mods = build_modules(preset(size), "cuda", torch.float32, dtype)
        randomize(mods, 1)
        codec = mods.codec.eval()
        codec.prepare()
        err = max(_stream_vs_offline(codec, 90, s) for s in (ChunkSchedule(), ChunkSchedule(1, (), 1)))
        record_property(f"{size}-{dtype}-stream-vs-offline-max-abs", err)
        print(f"{size} {dtype}: streamed vs offline max abs diff {err:.3g}")
        assert err <= tol


def test_cuda_bf16_model_runs_and_stays_near_fp32(record_property: pytest.RecordProperty) -> None:
    params = StreamParams(voice="ryan", greedy=True, forced_frames=20, seed=0)
    text = ["Half precision, same weights."]
    fp32 = load_qwen3(None, "tiny", device="cuda", seed=4, max_seq_len=128)
    bf16 = load_qwen3(None, "tiny", device="cuda", dtype="bf16", seed=4, max_seq_len=128)
    a, b = run_stream(fp32, 0, text, params), run_stream(bf16, 0, text, params)
    assert b.shape == a.shape and (b >= 0).all() and (b < 2048).all()
    agree = float((a == b).all(axis=1).mean())
    wa = fp32.codec.decode(torch.from_numpy(a).T[None].cuda())[0]
    wb = bf16.codec.decode(torch.from_numpy(a).T[None].cuda())[0]
    dev = float((wa - wb).abs().max())
    record_property("bf16-frame-agreement-with-fp32", agree)
    record_property("bf16-codec-max-abs-vs-fp32", dev)
    print(f"bf16: {agree:.0%} of frames equal fp32 greedy; codec max abs deviation {dev:.3g}")
    assert dev < 0.05
