"""The decode step on the fused Triton kernels (fused_decode.py) gives the unfused step's codes.

On a machine without CUDA the kernels run in Triton's CPU interpreter, in fp32, where the fused kernels
round exactly like the unfused layers: the codes of greedy and seeded-sampling streams joining and
leaving must be identical, and so must the talker's KV cache; a stream's first frame, fed to the fused
talker step from its prompt's last position, must be the one a whole-prompt prefill samples. (On the
H200 the GPU tests compare the two in bf16 at the real sizes.)
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    # read when a @triton.jit function is decorated: before kernels/ is first imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

from voicewire.engine.model import StreamParams
from voicewire.engine.qwen3 import ExperimentalOptions, FusedSettings, Qwen3TTSModel, ServeOptions, load_qwen3

from .conftest import prefill_reference, run_joining

# (slot, join at step, text, params): greedy and sampled streams with top-k / top-p and a penalty
# Few frames: under the Triton interpreter a frame (a talker step, 15 predictor passes) takes ~7 s on 2 cores.
STREAMS = [
    (0, 0, "Hello world, this is a test.", StreamParams(voice="ryan", greedy=True, forced_frames=4, seed=1)),
    (3, 1, "The quick brown fox.", StreamParams(voice="vivian", greedy=False, forced_frames=3, seed=77)),
    (1, 2, "Sampled, with a seed.", StreamParams(voice="aiden", greedy=False, forced_frames=2, seed=1234)),
]


def _model(fused: bool, settings: FusedSettings | None = None) -> Qwen3TTSModel:
    opts = ServeOptions(
        max_slots=4,
        max_batch_size=4,
        max_seq_len=64,
        cuda_graphs=False,
        experimental=ExperimentalOptions(fused_kernels=fused, fused=settings or FusedSettings()),
    )
    return load_qwen3(None, "tiny", device="cpu", seed=5, options=opts)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU interpreter case; the GPU has its own")
@pytest.mark.parametrize(
    "settings",
    [FusedSettings(), FusedSettings(cublas_rows=0, residual_cublas_rows=0)],
    ids=["fused-linears", "norm+cublas-linears"],
)
def test_fused_step_gives_the_unfused_codes_and_cache(settings: FusedSettings) -> None:
    """Both ways of running the linears: the fused kernels (few rows) and norm + GEMM + epilogue (many).
    The prefill runs on them too: its KV is in the cache compared."""
    fused, plain = _model(True, settings), _model(False)
    assert fused.step.fused is not None and plain.step.fused is None
    got, want = run_joining(fused, STREAMS, 8), run_joining(plain, STREAMS, 8)
    for slot, _, _, params in STREAMS:
        assert got[slot].shape == (params.forced_frames, 16)
        np.testing.assert_array_equal(got[slot], want[slot], err_msg=f"slot {slot}")
    torch.testing.assert_close(fused.kv.k, plain.kv.k, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fused.kv.v, plain.kv.v, rtol=1e-5, atol=1e-5)
    assert torch.equal(fused.state.seen, plain.state.seen)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU interpreter case; the GPU has its own")
def test_fused_first_frames_are_those_of_the_whole_prompt_prefill() -> None:
    """The first feed through the fused talker step, new streams beside running ones, against the
    prefill over every prompt position (unfused talker) and the fused tail on its last hidden state."""
    model = _model(True)
    whole = {"whole_text": True}
    streams = [
        (0, 0, "Hello world.", StreamParams(voice="ryan", greedy=True, forced_frames=2)),
        (3, 1, "The quick brown fox.", StreamParams(voice="vivian", greedy=False, forced_frames=2, seed=77)),
        (2, 1, "All of it.", StreamParams(voice="eric", greedy=True, forced_frames=1, extra=whole)),
    ]
    got = run_joining(model, streams, 8)
    for slot, _, text, params in streams:
        np.testing.assert_array_equal(
            got[slot], prefill_reference(model, slot, text, params), err_msg=f"slot {slot}"
        )


def test_fused_settings_take_only_the_row_counts_the_gemv_kernel_has() -> None:
    from voicewire.engine.qwen3.options import GEMV_MAX_ROWS as OPTIONS_GEMV_MAX_ROWS
    from voicewire.kernels.gemv import GEMV_MAX_ROWS

    assert OPTIONS_GEMV_MAX_ROWS == GEMV_MAX_ROWS
    for rows in (0, 1, 2):
        assert FusedSettings(gemv_rows=rows).gemv_rows == rows
    for rows in (-1, 3):
        with pytest.raises(ValueError, match="gemv_rows"):
            FusedSettings(gemv_rows=rows)
