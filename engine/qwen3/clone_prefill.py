"""A cloned voice inside a slot: its prompt, its text feed, and the prefill of a prompt with vectors in it.

The frame step's packed prefill rows carry ids only (frame_step.py); a cloned voice puts vectors on
the codec track: the x-vector at the speaker position and, in-context, the reference frames (each
the sum of its 16 code embeddings, as a decode step feeds a generated frame). So a prefill group
with a cloned voice in it builds its (B, T, H) input here and runs the frame step's prefill of
embeddings eagerly: the talker over all positions but the last, whose input waits as the slot's
first feed. Prefill is once per stream and sub-millisecond on a GPU; the decode steps after it are
the ordinary ones (a cloned voice leaves nothing in them, its first feed aside).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from .config import Qwen3TTSConfig
from .frame_step import FrameStep
from .host_staging import to_device
from .prompt import Prompt, build_icl_prompt, build_prompt, icl_fed_ids, icl_prompt_ready
from .voice_clone import VoiceProfile


@dataclass(frozen=True)
class SlotVoice:
    """A profile as one slot uses it, on the talker's device and in its dtype."""

    speaker: Tensor  # (H,) x-vector
    ref_frames: Tensor | None  # (F, H) summed code embeddings of the reference frames (in-context)
    ref_ids: tuple[int, ...]  # the reference transcript's token ids (in-context)
    key: bytes = b""  # the x-vector's digest: a kept prompt head's voice (prefix_cache.py)

    @property
    def n_ref_frames(self) -> int:
        return 0 if self.ref_frames is None else int(self.ref_frames.shape[0])

    def prompt(
        self,
        cfg: Qwen3TTSConfig,
        role_ids: Sequence[int],
        text_ids: Sequence[int],
        language_id: int | None,
        whole_text: bool,
    ) -> Prompt:
        if self.ref_frames is None:
            return build_prompt(
                cfg, role_ids, text_ids, language_id, None, whole_text=whole_text, cloned_speaker=True
            )
        return build_icl_prompt(
            cfg, role_ids, self.ref_ids, text_ids, self.n_ref_frames, language_id, whole_text
        )

    @property
    def text_shift(self) -> int:
        """len(fed_ids(text)) - len(text), before the clamp at 0."""
        return len(self.ref_ids) - self.n_ref_frames

    def prefill_ready(self, n_text_ids: int, final: bool) -> bool:
        """Streamed text: enough of it for the prompt (the caller handles whole-text mode)."""
        if self.ref_frames is None:
            return final or n_text_ids > 0
        return icl_prompt_ready(len(self.ref_ids), n_text_ids, self.n_ref_frames, final)

    def fed_ids(self, text_ids: Sequence[int]) -> list[int]:
        """What the slot's device text queue holds: entry k goes in with frame k (see frame_step.py)."""
        if self.ref_frames is None:
            return list(text_ids)
        return icl_fed_ids(self.ref_ids, text_ids, self.n_ref_frames)


def slot_voice(profile: VoiceProfile, step: FrameStep, ref_ids: Sequence[int]) -> SlotVoice:
    """Move a profile onto the talker's device; the reference frames embedded once, here."""
    emb = step.talker.codec_embedding.weight
    speaker = profile.speaker_embedding.to(device=emb.device, dtype=emb.dtype)
    frames = None
    if profile.ref_codes is not None:
        codes = profile.ref_codes.to(device=emb.device, dtype=torch.int64)  # (F, 16)
        frames = embed_frames(step, codes)
    digest = hashlib.blake2b(profile.speaker_embedding.float().numpy().tobytes(), digest_size=16).digest()
    return SlotVoice(speaker, frames, tuple(ref_ids) if frames is not None else (), digest)


def embed_frames(step: FrameStep, codes: Tensor) -> Tensor:
    """codes (F, 16) -> (F, H): codebook 0 through the talker's table, 1..15 through the predictor's."""
    groups = torch.arange(codes.shape[1] - 1, device=codes.device)[None, :]
    parts = (step.talker.codec_embedding(codes[:, :1]), step.cp_tables[groups, codes[:, 1:]])
    return torch.cat(parts, dim=1).sum(dim=1)


def embed_prompt(step: FrameStep, prompt: Prompt, voice: SlotVoice | None) -> Tensor:
    """One prompt -> its input embeddings (T, H): text track + codec track (ids or the voice's vectors)."""
    dev = step.talker.codec_embedding.weight.device
    text = to_device(list(prompt.text_ids), torch.int64, dev)
    ids = to_device([-1 if c is None else c for c in prompt.codec_ids], torch.int64, dev)
    has_id = (ids >= 0)[:, None]
    x = step.talker.embed_text(text) + step.talker.codec_embedding(ids.clamp(min=0)) * has_id
    if voice is not None and prompt.speaker_at is not None:
        x[prompt.speaker_at] += voice.speaker
    if voice is not None and voice.ref_frames is not None and prompt.ref_at is not None:
        x[prompt.ref_at : prompt.ref_at + voice.n_ref_frames] += voice.ref_frames
    return x


def prefill_embedded(
    step: FrameStep, prompts: Sequence[Prompt], voices: Sequence[SlotVoice | None], slots: Sequence[int]
) -> None:
    """The frame step's prefill for prompts given as embeddings (FrameStep.prefill_embeddings):
    each slot's first feed set, its frame made by the next decode step.

    Rows are right-padded to the longest prompt, as the packed prefill pads them."""
    dev = step.talker.codec_embedding.weight.device
    rows = [embed_prompt(step, p, v) for p, v in zip(prompts, voices, strict=True)]
    b, t = len(rows), max(len(p) for p in prompts)
    x = torch.zeros(b, t, rows[0].shape[1], dtype=rows[0].dtype, device=dev)
    for i, r in enumerate(rows):
        x[i, : r.shape[0]] = r
    lengths = torch.tensor([len(p) for p in prompts], device=dev)
    step.prefill_embeddings(x, lengths, torch.tensor(list(slots), device=dev))
