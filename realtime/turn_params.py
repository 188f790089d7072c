"""A turn's engine stream options: the voice it speaks in, and what its first ``text.delta`` chose.

A voice a client names is a stored cloned voice (voices.py: its options carry the clone) or a name
resolved by the rule /v1/audio/speech follows (voice_names.py: "alloy" is the default voice). A
cloned voice's name is kept as given, and looked up again when a turn opens with it.
"""

from __future__ import annotations

import dataclasses

from voicewire.engine import ModelInfo, StreamParams

from .protocol import ProtocolError, TurnId, TurnOptions
from .voice_names import UnknownVoice, resolve_voice
from .voices import VoiceStore


def cloned_params(voice: str, voices: VoiceStore | None, info: ModelInfo) -> StreamParams | None:
    """A stored cloned voice's stream options, or None when ``voice`` names none."""
    if not voice or voices is None or voice in info.voices:
        return None
    return voices.stream_params(voice, info)


def engine_voice(
    voice: str | None, voices: VoiceStore | None, info: ModelInfo, turn_id: TurnId | None = None
) -> str | None:
    """A client's voice name as the engine knows it (a cloned voice's name as given). Raises
    ProtocolError (invalid_voice) for a voice neither the model nor the store has."""
    if voice and cloned_params(voice, voices, info) is None:
        try:
            return resolve_voice(voice, info.voices)
        except UnknownVoice as err:
            raise ProtocolError("invalid_voice", err.message, turn_id) from None
    return voice


def turn_params(
    voice: str, options: TurnOptions, voices: VoiceStore | None, info: ModelInfo, tenant: str | None
) -> StreamParams:
    """The options a turn's stream opens with; ``tenant`` None keeps the voice's own."""
    params = cloned_params(voice, voices, info) or StreamParams(voice=voice)
    extra = dict(params.extra)
    if options.instructions:
        extra["instruct"] = options.instructions  # Qwen3-TTS 1.7B; other models ignore it
    return dataclasses.replace(
        params,
        speed=options.speed if options.speed is not None else params.speed,
        language=options.language if options.language is not None else params.language,
        extra=extra,
        tenant=tenant if tenant is not None else params.tenant,
    )
