"""Which of the model's voices a name a client sends means: one rule for every transport.

``POST /v1/audio/speech`` and ``session.update`` resolve a voice name the same way: the model's
own names match case-insensitively; OpenAI's built-in names, and Qwen3-TTS's speaker names on a
model without them, mean the default voice; any other name is unknown. A cloned voice (by id or
name) is looked up before this rule, by the caller (voices.py).
"""

from __future__ import annotations

from .protocol import echo

# OpenAI's built-in voice names; a drop-in client always sends one. They all map to this server's
# default voice (the model's own voice names are accepted too).
OPENAI_VOICES = frozenset(
    [
        "alloy",
        "ash",
        "ballad",
        "coral",
        "echo",
        "fable",
        "nova",
        "onyx",
        "sage",
        "shimmer",
        "verse",
        "marin",
        "cedar",
    ]
)
# Qwen3-TTS CustomVoice's speaker names, which benchmark harnesses send (Nari Labs tts_bench:
# "Ryan"). On a model that has them they pick that speaker; on one without, they map to its
# default voice like the OpenAI names, so a harness written for Qwen3-TTS runs against any model.
QWEN3_SPEAKERS = frozenset(
    ["vivian", "serena", "uncle_fu", "dylan", "eric", "ryan", "aiden", "ono_anna", "sohee"]
)


class UnknownVoice(ValueError):
    """A voice name neither the model nor the rule above knows. ``message`` says what is known;
    ``str()`` is ``invalid_voice:<message>``, the "code:message" of http_api.parse_speech's errors."""

    def __init__(self, message: str) -> None:
        super().__init__(f"invalid_voice:{message}")
        self.message = message


def resolve_voice(voice: str, voices: tuple[str, ...]) -> str:
    """The model's spelling of ``voice`` ("" = its default); UnknownVoice for an unknown name.
    ``voices``: the model's own (``ModelInfo.voices``)."""
    if not voice:
        return ""
    key = voice.lower()
    for name in voices:
        if name.lower() == key:
            return name
    if key in OPENAI_VOICES or key in QWEN3_SPEAKERS:
        return ""
    raise UnknownVoice(f"unknown voice {echo(voice)}; use one of {', '.join(voices)} or an OpenAI name")
