"""What one stream asks of the model, checked against the checkpoint before its slot is touched.

``parse_request`` turns ``StreamParams`` (voice, language, seed, greedy, the ``extra`` overrides of
the sampling defaults, an instruction, a cloned voice profile) into the ids the prompt needs and
the sampling row of the slot's device state. A bad request raises ``ModelError`` naming what is
wrong, and nothing of the slot has changed yet.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from ..cloned_voice import ClonedVoice
from ..model import ModelError, StreamParams
from .config import Qwen3TTSConfig
from .slot_state import SamplingRow
from .tokenizer import TextTokenizer
from .voice_clone import PROFILE_KEY, VoiceProfile


@dataclass(frozen=True)
class SlotRequest:
    language_id: int | None  # codec id of the language; None = auto
    speaker_id: int | None  # codec id of a CustomVoice speaker; None for Base / VoiceDesign
    instruct_ids: list[int]  # the instruction's prompt ids ([] when none, or on the 0.6B model)
    sampling: SamplingRow
    whole_text: bool  # wait for the end of the text and put all of it in the prompt (see prompt.py)
    profile: VoiceProfile | None  # a cloned voice (Base checkpoints)


def parse_request(
    cfg: Qwen3TTSConfig,
    tokenizer: TextTokenizer,
    voices: Sequence[str],
    slot: int,
    params: StreamParams,
    random_weights: bool,
    voice_encoder: str = "",
) -> SlotRequest:
    """``voices``: the model's voice names, the first the default; ``voice_encoder``: the model's
    cloning encoder (ModelInfo.voice_encoder), which a ``ClonedVoice`` must come from."""
    t, g = cfg.talker, cfg.generation
    speaker_id: int | None = None
    voice = params.voice or voices[0]
    profile = params.extra.get(PROFILE_KEY)
    if isinstance(profile, ClonedVoice):
        if profile.encoder != voice_encoder:
            raise ModelError(
                slot,
                f"this voice was cloned by {profile.encoder!r}, not by this model's encoder "
                f"({voice_encoder or 'none'}): clone it again from its reference audio",
            )
        try:
            profile = VoiceProfile.from_cloned(profile)
        except ValueError as err:
            raise ModelError(slot, str(err)) from None
    if profile is not None and not isinstance(profile, VoiceProfile):
        raise ModelError(slot, f"extra[{PROFILE_KEY!r}] must be a VoiceProfile or a ClonedVoice")
    if profile is not None and cfg.model_type != "base":
        raise ModelError(slot, f"voice cloning needs a Base checkpoint, this one is {cfg.model_type}")
    if profile is not None and profile.speaker_embedding.shape[0] != t.hidden_size:
        raise ModelError(slot, f"the voice profile's x-vector is not {t.hidden_size} wide")
    if cfg.model_type == "custom_voice":
        try:
            speaker_id = t.speaker_id(voice)
        except KeyError:
            raise ModelError(slot, f"unknown voice {voice!r}; voices: {', '.join(voices)}") from None
    elif voice != "default" and profile is None:
        raise ModelError(
            slot,
            f"this {cfg.model_type} checkpoint has no named voices "
            f"(clone one: extra[{PROFILE_KEY!r}], voice_clone.py)",
        )
    language = params.language or "auto"
    try:
        language_id = t.language_id(language)
    except KeyError:
        names = ", ".join(["auto", *(name for name, _ in t.languages)])
        raise ModelError(slot, f"unknown language {language!r}; languages: {names}") from None
    dialect = t.speaker_dialect(voice) if speaker_id is not None else ""
    if dialect and language.lower() in ("chinese", "auto"):
        language_id = t.language_id(dialect)
    instruct = str(params.extra.get("instruct", "") or "")
    # the package drops instructions for the 0.6B model
    instruct_ids = tokenizer.instruct_ids(instruct) if instruct and cfg.model_size != "0b6" else []
    extra = params.extra
    greedy = params.greedy or not bool(extra.get("do_sample", g.do_sample))
    cp_greedy = params.greedy or not bool(extra.get("subtalker_do_sample", g.subtalker_do_sample))
    vocab = (t.vocab_size, cfg.code_predictor.vocab_size)
    rows = []  # (temperature, top_k, top_p) of codebook 0 and of codebooks 1..15
    for prefix, (temp, top_k, top_p) in (
        ("", (g.temperature, g.top_k, g.top_p)),
        ("subtalker_", (g.subtalker_temperature, g.subtalker_top_k, g.subtalker_top_p)),
    ):
        try:
            row = (
                float(extra.get(prefix + "temperature", temp)),  # type: ignore[arg-type]
                int(extra.get(prefix + "top_k", top_k)),  # type: ignore[call-overload]
                float(extra.get(prefix + "top_p", top_p)),  # type: ignore[arg-type]
            )
        except (TypeError, ValueError):
            raise ModelError(slot, f"bad {prefix}temperature / top_k / top_p") from None
        if row[0] <= 0 or not 0 < row[2] <= 1:
            raise ModelError(slot, f"{prefix}temperature must be > 0 and {prefix}top_p in (0, 1]")
        rows.append(row)
    penalty = float(extra.get("repetition_penalty", g.repetition_penalty))  # type: ignore[arg-type]
    if penalty <= 0:
        raise ModelError(slot, "repetition_penalty must be > 0")
    sampling = SamplingRow(
        greedy=(greedy, cp_greedy),
        temperature=(rows[0][0], rows[1][0]),
        # 0 disables top-k (HF)
        top_k=(
            rows[0][1] if rows[0][1] > 0 else vocab[0],
            rows[1][1] if rows[1][1] > 0 else vocab[1],
        ),
        top_p=(rows[0][2], rows[1][2]),
        repetition_penalty=penalty,
        seed=(params.seed if params.seed is not None else random.getrandbits(32)) & 0xFFFFFFFF,
        eos_always_masked=random_weights or params.forced_frames is not None,
    )
    return SlotRequest(
        language_id=language_id,
        speaker_id=speaker_id,
        instruct_ids=instruct_ids,
        sampling=sampling,
        whole_text=bool(extra.get("whole_text", False)),
        profile=profile,
    )
