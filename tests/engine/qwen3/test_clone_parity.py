"""Voice cloning (Base) against the official qwen-tts 0.1.1 on identical random weights and reference clips.

The speaker encoder (log-mel features, x-vector), the speech tokenizer's encoder (reference codes),
and greedy generation with a cloned voice in both modes (x-vector only; in-context with the
reference transcript, text streamed or whole), against what ``create_voice_clone_prompt`` and
``generate_voice_clone``'s path give (oracle_run.py ``run_clone``). Skips only without the oracle
environment, like test_parity.py.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from voicewire.engine.model import ModelError, StreamParams
from voicewire.engine.qwen3 import Qwen3TTSModel, load_qwen3
from voicewire.engine.qwen3.speaker_encoder import log_mel
from voicewire.engine.qwen3.voice_clone import PROFILE_KEY, VoiceCloner, VoiceProfile

from .conftest import run_joining, run_stream
from .oracle import CHECKPOINTS, OracleRun, reference_audio

MEL_TOL = 1e-4  # fp32, log domain
XVEC_TOL = 1e-4  # fp32, relative to the x-vector's largest entry
SPEC: dict[str, Any] = next(c for c in CHECKPOINTS if c["name"] == "base")["clone"]
REFS = range(len(SPEC["refs"]))
CASES = range(len(SPEC["cases"]))


def _wav(j: int) -> np.ndarray:
    r = SPEC["refs"][j]
    return reference_audio(r["seconds"], r["rate_hz"], r["seed"])


@pytest.fixture(scope="module")
def base(oracle: OracleRun, device: str) -> Qwen3TTSModel:
    return load_qwen3(oracle.directory("base"), device=device, max_slots=4, max_batch_size=4, max_seq_len=256)


@pytest.fixture(scope="module")
def cloner(oracle: OracleRun, base: Qwen3TTSModel, device: str) -> VoiceCloner:
    return VoiceCloner.from_checkpoint(oracle.directory("base"), base.speaker_encoder_weights, device)


@pytest.fixture(scope="module")
def profiles(cloner: VoiceCloner) -> dict[tuple[int, bool], VoiceProfile]:
    """(reference, in-context) -> profile, each computed once."""
    out = {}
    for j in REFS:
        r = SPEC["refs"][j]
        icl = cloner.profile(_wav(j), r["rate_hz"], r["text"])
        out[(j, True)] = icl
        out[(j, False)] = VoiceProfile(icl.speaker_embedding)
    return out


def _params(case: dict[str, Any], profile: VoiceProfile) -> StreamParams:
    return StreamParams(
        language=case["language"],
        greedy=True,
        forced_frames=case["frames"],
        seed=0,
        extra={"whole_text": case.get("whole_text", False), PROFILE_KEY: profile},
    )


def _case(i: int) -> tuple[dict[str, Any], tuple[int, bool]]:
    c = SPEC["cases"][i]
    return c, (c["ref"], c["icl"])


def _assert_codes_equal(codes: np.ndarray, ref: np.ndarray) -> None:
    assert codes.shape == ref.shape, (codes.shape, ref.shape)
    mismatch = np.argwhere(codes != ref)
    assert mismatch.size == 0, f"first mismatches (frame, codebook): {mismatch[:5]}"


# --- the speaker encoder -------------------------------------------------------------------------
@pytest.mark.parametrize("j", [j for j in REFS if SPEC["refs"][j]["rate_hz"] == 24_000])
def test_log_mel_features_equal_the_package(oracle: OracleRun, cloner: VoiceCloner, j: int) -> None:
    ref = oracle.ref[f"base/ref{j}/mels"]
    ours = log_mel(torch.from_numpy(_wav(j))[None], cloner.speaker_encoder.mel_bank)[0].numpy()
    assert ours.shape == ref.shape == ((_wav(j).size - 256) // 256 + 1, 128)
    np.testing.assert_allclose(ours, ref, rtol=0, atol=MEL_TOL)


@pytest.mark.parametrize("j", REFS)
def test_speaker_embedding_equals_the_package(
    oracle: OracleRun, profiles: dict[tuple[int, bool], VoiceProfile], j: int
) -> None:
    ref = oracle.ref[f"base/ref{j}/xvec"]
    ours = profiles[(j, False)].speaker_embedding.numpy()
    assert ours.shape == ref.shape == (64,)
    assert ref.std() > 0.05  # an x-vector of zeros would pass anything downstream
    np.testing.assert_allclose(ours, ref, rtol=0, atol=XVEC_TOL * np.abs(ref).max())


# --- the speech tokenizer's encoder --------------------------------------------------------------
@pytest.mark.parametrize("j", REFS)
def test_reference_codes_equal_the_package(
    oracle: OracleRun, profiles: dict[tuple[int, bool], VoiceProfile], j: int
) -> None:
    ref = oracle.ref[f"base/ref{j}/codes"]
    codes = profiles[(j, True)].ref_codes
    assert codes is not None
    r = SPEC["refs"][j]
    assert ref.shape == (int(np.ceil(r["seconds"] * 24_000 / 1920)), 16)
    assert len(np.unique(ref)) > ref.size // 4  # random codebooks that all map to code 0 would pass
    _assert_codes_equal(codes.numpy(), ref)


# --- greedy generation with a cloned voice -------------------------------------------------------
@pytest.mark.parametrize("i", [i for i in CASES if SPEC["cases"][i]["icl"]])
def test_reference_transcript_ids_equal_the_official_processor(
    oracle: OracleRun, base: Qwen3TTSModel, i: int
) -> None:
    c = SPEC["cases"][i]
    ref = oracle.ref[f"base/c{i}/ref_ids"].tolist()  # <|im_start|>assistant\n{ref}<|im_end|>\n
    assert ref[:3] == base.tokenizer.role_ids
    assert ref[3:-2] == base.tokenizer.encode(SPEC["refs"][c["ref"]]["text"])


@pytest.mark.parametrize("i", CASES)
def test_cloned_greedy_codes_equal_the_package(
    oracle: OracleRun, base: Qwen3TTSModel, profiles: dict[tuple[int, bool], VoiceProfile], i: int
) -> None:
    c, key = _case(i)
    codes = run_stream(base, 0, [c["text"]], _params(c, profiles[key]))
    _assert_codes_equal(codes, oracle.ref[f"base/c{i}/codes"])


def _run_word_by_word(model: Qwen3TTSModel, text: str, params: StreamParams) -> np.ndarray:
    """One word per generate step, as an LLM streams them: the slot waits whenever text runs dry."""
    words = text.split(" ")
    model.open_slot(0, params)
    frames: list[np.ndarray] = []
    sent = 0
    for _ in range(10 * len(words) + params.forced_frames + 10):  # type: ignore[operator]
        if sent < len(words):
            model.add_text(0, [words[sent] + (" " if sent + 1 < len(words) else "")], sent + 1 == len(words))
            sent += 1
        if model.ready(0):
            r = model.generate([0])[0]
            if r.frames is not None:
                frames.append(np.asarray(r.frames))
            if r.finished:
                break
    model.close_slot(0)
    return np.concatenate(frames)


@pytest.mark.parametrize("i", [0, 2])
def test_cloned_codes_with_text_streamed_word_by_word(
    oracle: OracleRun, base: Qwen3TTSModel, profiles: dict[tuple[int, bool], VoiceProfile], i: int
) -> None:
    # case 2: the in-context prompt waits for the words its last positions carry, the rest trails
    c, key = _case(i)
    codes = _run_word_by_word(base, c["text"], _params(c, profiles[key]))
    _assert_codes_equal(codes, oracle.ref[f"base/c{i}/codes"])


def test_cloned_and_plain_streams_share_prefill_and_decode_batches(
    oracle: OracleRun, base: Qwen3TTSModel, profiles: dict[tuple[int, bool], VoiceProfile]
) -> None:
    plain = next(c for c in CHECKPOINTS if c["name"] == "base")["prompts"][0]
    streams = [
        (
            0,
            0,
            plain["text"],
            StreamParams(language=plain["language"], greedy=True, forced_frames=plain["frames"], seed=0),
        )
    ]
    for slot, (i, join) in enumerate([(0, 0), (2, 0), (1, 3)], start=1):
        c, key = _case(i)
        streams.append((slot, join, c["text"], _params(c, profiles[key])))
    got = run_joining(base, streams, 60)
    _assert_codes_equal(got[0], oracle.ref["base/p0/codes"])
    for slot, i in ((1, 0), (2, 2), (3, 1)):
        _assert_codes_equal(got[slot], oracle.ref[f"base/c{i}/codes"])


def test_the_cloned_voice_steers_generation(
    oracle: OracleRun, base: Qwen3TTSModel, profiles: dict[tuple[int, bool], VoiceProfile]
) -> None:
    """The parity above is not vacuous: another x-vector, or other reference frames, change the codes."""
    c, key = _case(0)
    other = VoiceProfile(profiles[key].speaker_embedding.roll(1))
    assert (run_stream(base, 0, [c["text"]], _params(c, other)) != oracle.ref["base/c0/codes"]).any()
    c, key = _case(1)
    p = profiles[key]
    assert p.ref_codes is not None
    shuffled = VoiceProfile(p.speaker_embedding, p.ref_codes.flip(0), p.ref_text)
    assert (run_stream(base, 0, [c["text"]], _params(c, shuffled)) != oracle.ref["base/c1/codes"]).any()


# --- refusals ------------------------------------------------------------------------------------
def test_cloning_is_refused_where_it_cannot_work(
    base: Qwen3TTSModel, tiny: Qwen3TTSModel, profiles: dict[tuple[int, bool], VoiceProfile]
) -> None:
    p = profiles[(0, False)]
    with pytest.raises(ModelError, match="Base checkpoint"):
        tiny.open_slot(0, StreamParams(extra={PROFILE_KEY: p}))
    with pytest.raises(ModelError, match="VoiceProfile"):
        base.open_slot(0, StreamParams(extra={PROFILE_KEY: "not a profile"}))
    with pytest.raises(ModelError, match="wide"):
        base.open_slot(0, StreamParams(extra={PROFILE_KEY: VoiceProfile(torch.zeros(8))}))
    with pytest.raises(ValueError, match="both ref_codes and ref_text"):
        VoiceProfile(p.speaker_embedding, ref_text="text without codes")


def test_a_random_cloner_clones_on_a_random_base_model(device: str) -> None:
    """No oracle needed: the random-weight path the voices API and the benchmarks use."""
    model = load_qwen3(None, "tiny-base", device=device, seed=4, max_slots=2, max_batch_size=2)
    cloner = VoiceCloner.random(model.cfg, seed=5, device=device)
    wav = reference_audio(1.5, 24_000, seed=6)
    icl = cloner.profile(wav, 24_000, "Hello world.")
    assert icl.ref_codes is not None and icl.ref_codes.shape == (19, 16)
    assert 0.05 < float(icl.speaker_embedding.std()) < 5.0
    runs = {}
    for name, profile in (("xvec", VoiceProfile(icl.speaker_embedding)), ("icl", icl)):
        params = StreamParams(greedy=True, forced_frames=6, seed=0, extra={PROFILE_KEY: profile})
        runs[name] = run_stream(model, 0, ["A cloned voice."], params)
        assert runs[name].shape == (6, 16)
    assert (runs["xvec"] != runs["icl"]).any()


def test_an_in_context_voice_plays_as_the_continuation_of_its_reference(device: str) -> None:
    """The official implementation decodes reference + generated codes and cuts the reference's
    samples. A slot of an in-context voice starts its decoder primed with the reference codes, so
    its streamed audio, chunk by chunk, equals that (unprimed, the first frames decode from silence)."""
    from voicewire.engine.model import DecodeWork

    model = load_qwen3(None, "tiny-base", device=device, seed=4, max_slots=2, max_batch_size=2)
    cloner = VoiceCloner.random(model.cfg, seed=5, device=device)
    icl = cloner.profile(reference_audio(1.5, 24_000, seed=6), 24_000, "Hello world.")
    assert icl.ref_codes is not None
    model.open_slot(0, StreamParams(greedy=True, forced_frames=8, seed=0, extra={PROFILE_KEY: icl}))
    model.add_text(0, ["A cloned voice."], True)
    frames, pcm = [], []
    while model.ready(0):
        r = model.generate([0])[0]
        if r.frames is not None:
            frames.append(r.frames)
            pcm.append(model.decode([DecodeWork(slot=0, frames=[r.frames], n_frames=1, final=r.finished)])[0])
        if r.finished:
            break
    model.close_slot(0)
    ref = icl.ref_codes.cpu().numpy().astype(np.int64)
    whole = torch.from_numpy(np.concatenate([ref, *frames])).T[None].to(model.device)
    expected = model.codec.decode(whole)[0].cpu().numpy()[len(ref) * model.cfg.codec.frame_samples :]
    assert len(frames) == 8
    np.testing.assert_allclose(np.concatenate(pcm), expected, rtol=0, atol=1e-4)
