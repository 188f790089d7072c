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
    tts_pad                              <speaker>    (Base: none, or a cloned x-vector)
    tts_bos                              codec_pad
    text[0]                              codec_bos

The rest of the text follows one token per frame (talker.py). With the whole text known up front
(``whole_text``), all of it goes into the prompt instead (see ``build_prompt``).

In-context cloning (``build_icl_prompt``) replaces the last position by the reference: the
reference transcript, then the text, then tts_eos on the text track, aligned position by position
with codec_bos and the reference frames (each the sum of its 16 code embeddings) on the codec track;
the shorter track is cut (text: the rest follows one token per frame) or padded (tts_pad).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .config import Qwen3TTSConfig


@dataclass(frozen=True)
class Prompt:
    text_ids: tuple[int, ...]  # text-track id at each position
    codec_ids: tuple[int | None, ...]  # codec-track id at each position, None = nothing added
    # cloned voices: positions whose codec track is a vector (codec_ids holds None there)
    speaker_at: int | None = None  # the x-vector
    ref_at: int | None = None  # the first reference frame; the rest follow, one per position

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
    cloned_speaker: bool = False,
) -> Prompt:
    """The prefill positions. Streamed text (default): only ``text_ids[0]`` goes in; the rest follows
    one token per frame. ``whole_text`` (the package's ``non_streaming_mode=True``, its default for
    CustomVoice): every text token goes in, each over codec_pad, then tts_eos over codec_pad and
    tts_pad over codec_bos; every later step is fed tts_pad. ``cloned_speaker``: a Base model's
    x-vector takes the speaker position (``speaker_id`` must be None).
    """
    t = cfg.talker
    text, codecs, speaker_at = _head(cfg, role_ids, language_id, speaker_id, instruct_ids, cloned_speaker)
    if whole_text:
        text += [*text_ids, cfg.tts_eos_id, cfg.tts_pad_id]
        codecs += [t.codec_pad_id] * (len(text_ids) + 1) + [t.codec_bos_id]
    else:
        text.append(text_ids[0])
        codecs.append(t.codec_bos_id)
    return Prompt(tuple(text), tuple(codecs), speaker_at)


def build_icl_prompt(
    cfg: Qwen3TTSConfig,
    role_ids: Sequence[int],
    ref_ids: Sequence[int],
    text_ids: Sequence[int],
    n_ref_frames: int,
    language_id: int | None,
    whole_text: bool = False,
) -> Prompt:
    """In-context cloning: the x-vector at the speaker position, then the reference (module docstring).

    Streamed text: position i of the last 1 + ``n_ref_frames`` carries (reference transcript + text +
    tts_eos)[i] (tts_pad past its end) over (codec_bos, reference frames)[i]; the text beyond follows
    one token per frame (``icl_fed_ids``). ``whole_text``: all of that text over codec_pad first, then
    codec_bos and the frames over tts_pad; every later step is fed tts_pad.
    """
    t = cfg.talker
    text, codecs, speaker_at = _head(cfg, role_ids, language_id, None, (), True)
    words = [*ref_ids, *text_ids, cfg.tts_eos_id]
    n_codec = 1 + n_ref_frames
    if whole_text:
        text += words
        codecs += [t.codec_pad_id] * len(words)
        text += [cfg.tts_pad_id] * n_codec
    else:
        text += words[:n_codec] + [cfg.tts_pad_id] * (n_codec - len(words))
    codecs.append(t.codec_bos_id)
    ref_at = len(codecs)
    codecs += [None] * n_ref_frames
    return Prompt(tuple(text), tuple(codecs), speaker_at, ref_at)


def icl_prompt_ready(n_ref_ids: int, n_text_ids: int, n_ref_frames: int, final: bool) -> bool:
    """A streamed in-context prompt needs the text up to its last position (or the end of the text)."""
    return final or n_ref_ids + n_text_ids >= 1 + n_ref_frames


def icl_fed_ids(ref_ids: Sequence[int], text_ids: Sequence[int], n_ref_frames: int) -> list[int]:
    """The streamed text after an in-context prompt, indexed as the device text queue is: entry k is
    fed with frame k (k >= 1; entry 0 was the prompt's last text position), tts_eos at the end."""
    return [*ref_ids, *text_ids][n_ref_frames:]


def _head(
    cfg: Qwen3TTSConfig,
    role_ids: Sequence[int],
    language_id: int | None,
    speaker_id: int | None,
    instruct_ids: Sequence[int],
    cloned_speaker: bool,
) -> tuple[list[int], list[int | None], int | None]:
    """(text ids, codec ids, x-vector position) of every prompt position before the codec_bos one."""
    t = cfg.talker
    if language_id is None:
        codec: list[int | None] = [t.codec_nothink_id, t.codec_think_bos_id, t.codec_think_eos_id]
    else:
        codec = [t.codec_think_id, t.codec_think_bos_id, language_id, t.codec_think_eos_id]
    if speaker_id is not None and cloned_speaker:
        raise ValueError("a prompt has one speaker: an id or a cloned x-vector")
    head = [*instruct_ids, *role_ids]
    speaker_at = None
    if speaker_id is not None:
        codec.append(speaker_id)
    elif cloned_speaker:
        speaker_at = len(head) + len(codec)
        codec.append(None)
    codec.append(t.codec_pad_id)
    text = [*head, *[cfg.tts_pad_id] * (len(codec) - 1), cfg.tts_bos_id]
    return text, [None] * len(head) + codec, speaker_at
