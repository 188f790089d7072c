"""Fixtures of the Qwen3-TTS tests: the device, a tiny random model, the official oracle's outputs.

``VOICEWIRE_TEST_DEVICE=cuda`` runs the model-level tests on the GPU (fp32); the default is CPU.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest
import torch

from voicewire.engine.model import StreamParams
from voicewire.engine.qwen3 import Qwen3TTSModel, load_qwen3
from voicewire.engine.qwen3.clone_prefill import embed_prompt
from voicewire.engine.qwen3.host_staging import Staging

from .oracle import ORACLE_DIR, SETUP, OracleRun, oracle_ready, run_oracle, shared_run

DEVICE = os.environ.get("VOICEWIRE_TEST_DEVICE", "cpu")


@pytest.fixture(scope="session")
def device() -> str:
    if DEVICE.startswith("cuda"):
        if not torch.cuda.is_available():
            pytest.skip("VOICEWIRE_TEST_DEVICE=cuda but no CUDA device")
        # fp32 bounds (1e-5 streaming, 1e-4 parity) need fp32 math: cuDNN convs default to TF32
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
    return DEVICE


@pytest.fixture(scope="session", autouse=True)
def _threads() -> Iterator[None]:
    # 2 shared cores: more intra-op threads only add contention
    old = torch.get_num_threads()
    torch.set_num_threads(min(old, 2))
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="module")
def tiny(device: str) -> Qwen3TTSModel:
    return load_qwen3(None, "tiny", device=device, seed=3, max_slots=6, max_batch_size=6, max_seq_len=256)


@pytest.fixture(scope="session")
def oracle(tmp_path_factory: pytest.TempPathFactory, device: str) -> OracleRun:
    if not oracle_ready():
        pytest.skip(f"official qwen-tts oracle env absent at {ORACLE_DIR}: run {SETUP}")
    folder = f"oracle-{device.replace(':', '')}"
    ahead = os.environ.get("VOICEWIRE_ORACLE_RUN")  # scripts/test starts the CPU run before pytest
    if ahead:
        return shared_run(Path(ahead) / folder, device)
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return run_oracle(Path(tmp_path_factory.mktemp("oracle")), device=device)
    # One run for all of pytest-xdist's workers (75-100 s on 2 cores), in their common temp parent.
    return shared_run(tmp_path_factory.getbasetemp().parent / folder, device)


def run_stream(
    model: Qwen3TTSModel,
    slot: int,
    text: Sequence[str],
    params: StreamParams,
    final: bool = True,
) -> np.ndarray:
    """Open a slot, give it the text pieces (all at once), generate alone until it stops -> (T, 16)."""
    model.open_slot(slot, params)
    model.add_text(slot, list(text), final)
    frames = []
    while model.ready(slot):
        r = model.generate([slot])[0]
        if r.frames is not None:
            frames.append(r.frames)
        if r.finished:
            break
    model.close_slot(slot)
    return np.concatenate(frames) if frames else np.zeros((0, 16), np.int64)


def run_joining(
    model: Qwen3TTSModel, streams: Sequence[tuple[int, int, str, StreamParams]], steps: int
) -> dict[int, np.ndarray]:
    """Streams (slot, join at step, text, params) joining a shared batch and leaving when done, for up
    to ``steps`` generate() calls -> each slot's codes (T, 16)."""
    got: dict[int, list[np.ndarray]] = {slot: [] for slot, *_ in streams}
    live: list[int] = []
    for step in range(steps):
        for slot, join, text, params in streams:
            if join == step:
                model.open_slot(slot, params)
                model.add_text(slot, [text], True)
                live.append(slot)
        for r in model.generate([s for s in live if model.ready(s)]):
            if r.frames is not None:
                got[r.slot].append(r.frames)
            if r.finished:
                live.remove(r.slot)
                model.close_slot(r.slot)
    assert not live, f"streams {live} still running after {steps} steps"
    return {s: np.concatenate(f) for s, f in got.items()}


def flush(model: Qwen3TTSModel) -> None:
    """The rows, text and KV blocks queued since the last step onto the device, as a step does."""
    model.state.flush(Staging(None, model.device), model.kv.pool.take_writes())


def prefill_reference(model: Qwen3TTSModel, slot: int, text: str, params: StreamParams) -> np.ndarray:
    """A stream's codes the straightforward way (test_frame_step.py): open the slot, prefill all n
    prompt positions and sample the first frame from the last one's hidden state, then one decode
    step of this slot alone per frame -> (forced_frames, 16). Reads the model's prompt of the slot."""
    assert params.forced_frames is not None
    model.open_slot(slot, params)
    model.add_text(slot, [text], True)
    assert not model.kv.grow({slot: model.options.max_seq_len})  # KV blocks, as generate_start takes them
    flush(model)  # as generate_start does: the decode steps below read the device rows, text and blocks
    prompt = model._prompt(model._slots[slot])
    step, dev, n = model.step, model.device, len(prompt)
    x = embed_prompt(step, prompt, model._slots[slot].voice)[None]  # (1, n, H)
    slots = torch.tensor([slot], device=dev)
    positions = torch.arange(n, device=dev)[None]
    mask = torch.ones(n, n, dtype=torch.bool, device=dev).tril()[None, None]
    hidden = model.talker(x, positions, model.kv.prefill(slots, n), mask)[:, -1]
    model.state.position[slot] = n
    codes = [step.sample_tail(slots, model.state.frames[slots], hidden)]
    while len(codes) < params.forced_frames:
        codes.append(step.decode(slots))
    model.close_slot(slot)
    return torch.cat(codes).cpu().numpy()
