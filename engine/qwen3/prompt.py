"""The talker prompt of the official CustomVoice / Base path (text streamed: ``non_streaming_mode=False``).

Position by position, each input is a text-track id plus (maybe) a codec-track id, summed as
embeddings. With a known language and a CustomVoice speaker:

    text track                           codec track
    [instruction ids]                    -            <|im_start|>user\n{instruct}<|im_end|>\n (1.7B)
    <|im_start|> assistant \n           -
    tts_pad                              think        ("auto" language: nothink, think_bos, think_eos)
    tts_pad                              think_bos
    tts_pad                              <language>
    tts_pad                              think_eos
    tts_pad                              <speaker>    (Base: none, or later the cloned x-vector)
    tts_bos                              codec_pad
    text[0]                              codec_bos

The rest of the text follows one token per frame (talker.py). With the whole text known up front
(``whole_text``), all of it goes into the prompt instead (see ``build_prompt``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .config import Qwen3TTSConfig


@dataclass(frozen=True)
class Prompt:
    text_ids: tuple[int, ...]  # text-track id at each position
    codec_ids: tuple[int | None, ...]  # codec-track id at each position, None = nothing added

    def __len__(self) -> int:
        return len(self.text_ids)


def build_prompt(
    cfg: Qwen3TTSConfig,
    role_ids: Sequence[int],
    text_ids: Sequence[int],
    language_id: int | None,
    speaker_id: int | None,
    instruct_ids: Sequence[int] = (),
    whole_text: bool = False,
) -> Prompt:
    """The prefill positions. Streamed text (default): only ``text_ids[0]`` goes in; the rest follows
    one token per frame. ``whole_text`` (the package's ``non_streaming_mode=True``, its default for
    CustomVoice): every text token goes in, each over codec_pad, then tts_eos over codec_pad and
    tts_pad over codec_bos; every later step is fed tts_pad.
    """
    t = cfg.talker
    if language_id is None:
        codec = [t.codec_nothink_id, t.codec_think_bos_id, t.codec_think_eos_id]
    else:
        codec = [t.codec_think_id, t.codec_think_bos_id, language_id, t.codec_think_eos_id]
    if speaker_id is not None:
        codec.append(speaker_id)
    codec += [t.codec_pad_id, t.codec_bos_id]
    head = [*instruct_ids, *role_ids]
    text = head + [cfg.tts_pad_id] * (len(codec) - 2) + [cfg.tts_bos_id]
    codecs: list[int | None] = [None] * len(head) + codec[:-1]
    if whole_text:
        text += [*text_ids, cfg.tts_eos_id, cfg.tts_pad_id]
        codecs += [t.codec_pad_id] * (len(text_ids) + 1) + [t.codec_bos_id]
    else:
        text.append(text_ids[0])
        codecs.append(t.codec_bos_id)
    return Prompt(tuple(text), tuple(codecs))
