"""Parity with the official qwen-tts 0.1.1 on identical random weights (written by the package itself).

Skips only when the oracle environment is absent (tests/engine/qwen3/oracle_setup.sh installs it).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from voicewire.engine.qwen3 import load_qwen3

from .conftest import run_stream
from .oracle import CHECKPOINTS, OracleRun, greedy_params

WAVE_TOL = 1e-4  # fp32
CASES = [(c["name"], i) for c in CHECKPOINTS for i in range(len(c["prompts"]))]


def _prompt(name: str, i: int) -> dict:
    return next(c for c in CHECKPOINTS if c["name"] == name)["prompts"][i]


@pytest.fixture(scope="module")
def models(oracle: OracleRun, device: str) -> dict:
    # our loader on the directories the official save_pretrained wrote (tiny: sharded)
    return {
        c["name"]: load_qwen3(oracle.directory(c["name"]), device=device, max_seq_len=256)
        for c in CHECKPOINTS
    }


@pytest.mark.parametrize(("name", "i"), CASES)
def test_tokenizer_ids_equal_the_official_processor(
    oracle: OracleRun, models: dict, name: str, i: int
) -> None:
    tok = models[name].tokenizer
    ref = oracle.ref[f"{name}/p{i}/input_ids"].tolist()
    assert ref[:3] == tok.role_ids
    assert ref[3:-5] == tok.encode(_prompt(name, i)["text"])


@pytest.mark.parametrize(("name", "i"), CASES)
def test_greedy_codes_equal_the_official_package(oracle: OracleRun, models: dict, name: str, i: int) -> None:
    p = _prompt(name, i)
    params = greedy_params(p)
    codes = run_stream(models[name], 0, [p["text"]], params)
    ref = oracle.ref[f"{name}/p{i}/codes"]
    assert ref.shape == (p["frames"], 16)
    mismatch = np.argwhere(codes != ref)
    assert codes.shape == ref.shape and mismatch.size == 0, (
        f"first mismatches (frame, codebook): {mismatch[:5]}"
    )


@pytest.mark.parametrize(("name", "i"), CASES)
def test_codec_waveform_equals_the_official_decode(
    oracle: OracleRun, models: dict, name: str, i: int
) -> None:
    codes = oracle.ref[f"{name}/p{i}/codes"]
    ref = oracle.ref[f"{name}/p{i}/wav"]
    ours = models[name].codec.decode(torch.from_numpy(codes).T[None].to(models[name].device))[0].cpu().numpy()
    assert ours.shape == ref.shape == (codes.shape[0] * 1920,)
    assert ref.std() > 1e-3  # a silent decoder would pass anything
    np.testing.assert_allclose(ours, ref, rtol=0, atol=WAVE_TOL)


def test_codec_waveform_of_random_codes_equals_the_official_decode(oracle: OracleRun, models: dict) -> None:
    codes, ref = oracle.ref["tiny/random_codes"], oracle.ref["tiny/random_wav"]
    model = models["tiny"]
    ours = model.codec.decode(torch.from_numpy(codes).T[None].to(model.device))[0].cpu().numpy()
    assert codes.shape == (100, 16) and ours.shape == ref.shape
    np.testing.assert_allclose(ours, ref, rtol=0, atol=WAVE_TOL)


def test_base_checkpoint_keeps_its_speaker_encoder_aside(models: dict) -> None:
    base = models["base"]
    assert base.cfg.model_type == "base" and base.info.voices == ("default",)
    assert base.speaker_encoder_weights and all(
        k.startswith("speaker_encoder.") for k in base.speaker_encoder_weights
    )
    assert not models["tiny"].speaker_encoder_weights
