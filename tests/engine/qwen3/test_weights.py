"""Checkpoint loading: the official layout round-trips; missing or mismatched files fail clearly."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from voicewire.engine.model import StreamParams
from voicewire.engine.qwen3 import CheckpointError, load_qwen3
from voicewire.engine.qwen3.presets import preset
from voicewire.engine.qwen3.testing import write_random_checkpoint
from voicewire.engine.qwen3.weights import build_modules, official_state_dicts, randomize

from .conftest import run_stream


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("ckpt") / "tiny"
    write_random_checkpoint(str(d), "tiny", seed=5, shard_max_bytes=3_000_000)
    return d


def _copy(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "copy"
    shutil.copytree(src, dst)
    return dst


def test_sharded_checkpoint_round_trips(ckpt: Path) -> None:
    assert (ckpt / "model.safetensors.index.json").is_file() and not (ckpt / "model.safetensors").exists()
    model = load_qwen3(str(ckpt), max_slots=2, max_batch_size=2, max_seq_len=64)
    mods = build_modules(preset("tiny"), "cpu", torch.float32, torch.float32)
    randomize(mods, 5)
    main, codec = official_state_dicts(mods)
    ours_main, ours_codec = official_state_dicts(
        type(mods)(model.talker, model.code_predictor, model.codec)  # the loaded modules
    )
    for ref, got in ((main, ours_main), (codec, ours_codec)):
        assert ref.keys() == got.keys()
        for k in ref:
            torch.testing.assert_close(got[k], ref[k], rtol=0, atol=0, msg=k)
    # and it speaks: a checkpoint model is not a random model (no forced length needed)
    codes = run_stream(model, 0, ["Hi there."], StreamParams(greedy=True, forced_frames=3))
    assert codes.shape == (3, 16) and not model.random_weights


def test_bf16_load_casts(ckpt: Path) -> None:
    model = load_qwen3(
        str(ckpt), dtype="bf16", codec_dtype="fp32", max_slots=1, max_batch_size=1, max_seq_len=64
    )
    assert next(model.talker.parameters()).dtype == torch.bfloat16
    assert next(model.codec.parameters()).dtype == torch.float32


@pytest.mark.parametrize(
    "remove",
    [
        "config.json",
        "speech_tokenizer/config.json",
        "speech_tokenizer/model.safetensors",
        "vocab.json",
        "merges.txt",
    ],
)
def test_missing_file_is_named(ckpt: Path, tmp_path: Path, remove: str) -> None:
    d = _copy(ckpt, tmp_path)
    os.remove(d / remove)
    with pytest.raises(CheckpointError, match=os.path.basename(remove)):
        load_qwen3(str(d), max_slots=1, max_batch_size=1, max_seq_len=64)


def test_missing_shard_is_named(ckpt: Path, tmp_path: Path) -> None:
    d = _copy(ckpt, tmp_path)
    shard = sorted(p for p in os.listdir(d) if p.startswith("model-0000"))[1]
    os.remove(d / shard)
    with pytest.raises(CheckpointError, match=shard):
        load_qwen3(str(d), max_slots=1, max_batch_size=1, max_seq_len=64)


def test_missing_tensor_is_named(ckpt: Path, tmp_path: Path) -> None:
    d = _copy(ckpt, tmp_path)
    path = d / "speech_tokenizer" / "model.safetensors"
    tensors = load_file(str(path))
    del tensors["decoder.pre_transformer.layers.1.mlp_layer_scale.scale"]
    del tensors["decoder.quantizer.rvq_rest.vq.layers.3._codebook.cluster_usage"]
    save_file(tensors, str(path))
    with pytest.raises(CheckpointError, match=r"2 tensors missing.*cluster_usage\[4\]"):
        load_qwen3(str(d), max_slots=1, max_batch_size=1, max_seq_len=64)


def test_tensor_that_does_not_fit_the_config_is_named(ckpt: Path, tmp_path: Path) -> None:
    d = _copy(ckpt, tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg["talker_config"]["intermediate_size"] = 96
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"talker\.model\.layers\.0\.mlp\.\w+_proj\.weight: shape"):
        load_qwen3(str(d), max_slots=1, max_batch_size=1, max_seq_len=64)


def test_unsupported_config_is_refused(ckpt: Path, tmp_path: Path) -> None:
    d = _copy(ckpt, tmp_path)
    sp = json.loads((d / "speech_tokenizer" / "config.json").read_text())
    sp["model_type"] = "qwen3_tts_tokenizer_25hz"
    (d / "speech_tokenizer" / "config.json").write_text(json.dumps(sp))
    with pytest.raises(CheckpointError, match="12 Hz"):
        load_qwen3(str(d), max_slots=1, max_batch_size=1, max_seq_len=64)


def test_corrupt_safetensors_is_refused(ckpt: Path, tmp_path: Path) -> None:
    d = _copy(ckpt, tmp_path)
    (d / "speech_tokenizer" / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match="cannot read"):
        load_qwen3(str(d), max_slots=1, max_batch_size=1, max_seq_len=64)


def test_base_checkpoint_with_speaker_encoder_loads(tmp_path: Path) -> None:
    """A Base checkpoint carries the speaker encoder in model.safetensors (``speaker_encoder.*``) and
    the speech tokenizer's encoder beside its decoder (``encoder.*``): it loads, clones and speaks;
    a checkpoint missing part of the speaker encoder is refused by name, one without it loads with
    cloning off."""
    from voicewire.engine.qwen3.voice_clone import VoiceCloner

    d = tmp_path / "base"
    cfg = write_random_checkpoint(str(d), "tiny-base", seed=1)
    cloner = VoiceCloner.random(cfg, seed=2)
    main, speech = d / "model.safetensors", d / "speech_tokenizer" / "model.safetensors"
    plain = load_file(str(main))
    speaker = {f"speaker_encoder.{k}": v.contiguous() for k, v in cloner.speaker_encoder.state_dict().items()}
    save_file({**plain, **speaker}, str(main))
    encoder = {f"encoder.{k}": v.contiguous() for k, v in cloner.codec_encoder.state_dict().items()}
    save_file({**load_file(str(speech)), **encoder}, str(speech))
    model = load_qwen3(str(d), max_slots=1, max_batch_size=1, max_seq_len=64)
    assert model.cfg.model_type == "base" and set(speaker) <= set(model.speaker_encoder_weights)
    assert model.info.voice_encoder.startswith("qwen3-tts-base/")
    codes = run_stream(model, 0, ["Base."], StreamParams(greedy=True, forced_frames=2))
    assert codes.shape == (2, 16)
    with pytest.raises(Exception, match="no named voices"):
        model.open_slot(0, StreamParams(voice="ryan"))

    dropped = sorted(speaker)[0]
    save_file({**plain, **{k: v for k, v in speaker.items() if k != dropped}}, str(main))
    with pytest.raises(CheckpointError, match=r"speaker encoder.*: 1 tensors missing"):
        load_qwen3(str(d), max_slots=1, max_batch_size=1, max_seq_len=64)
    save_file(plain, str(main))
    assert load_qwen3(str(d), max_slots=1, max_batch_size=1, max_seq_len=64).info.voice_encoder == ""


def test_random_sizes_have_the_published_parameter_counts() -> None:
    # meta-device modules: shapes only (peer-baseline.md "Size check")
    from voicewire.engine.qwen3.code_predictor import CodePredictor
    from voicewire.engine.qwen3.codec_decoder import CodecDecoder
    from voicewire.engine.qwen3.talker import Talker

    counts = {}
    for size in ("0.6b", "1.7b"):
        cfg = preset(size)
        with torch.device("meta"):
            talker, cp = Talker(cfg.talker), CodePredictor(cfg.code_predictor, cfg.talker.hidden_size)
            codec = CodecDecoder(cfg.codec)
        counts[size] = [sum(p.numel() for p in m.parameters()) / 1e6 for m in (talker, cp, codec)]
    # talker incl. embeddings + code predictor: 0.6B ~ 905.8 M, 1.7B ~ 1,916.7 M (peer-baseline.md)
    assert np.isclose(sum(counts["0.6b"][:2]), 905.8, atol=1.0)
    assert np.isclose(sum(counts["1.7b"][:2]), 1916.7, atol=1.0)
