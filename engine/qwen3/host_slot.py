"""A Qwen3-TTS slot's host side: its text, voice and limits, and what each frame made means for it.

The device side of a slot is rows of tensors and KV blocks (slot_state.py, kv_cache.py); this is what
the host keeps per stream to decide readiness, stopping and word timings from the one copy of
sampled codes a step makes (model.py). Plain Python and numpy: no torch.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..model import GenerateResult
from ..word_timing import TokenWords, WordTiming
from .clone_prefill import SlotVoice
from .config import Qwen3TTSConfig
from .guards import GuardLimits
from .prompt import Prompt, build_prompt
from .tokenizer import TextStream

log = logging.getLogger("voicewire.qwen3")


def invalid_rows(host: np.ndarray, codebook_size: int, eos_id: int) -> np.ndarray:
    """(B, 16) codes -> (B,) bool: a code the codec cannot decode (and not the EOS that stops a
    stream). Never expected; checked on the host copy the step makes anyway, so a device-side
    fault fails one stream with an error instead of asserting inside the codec for all."""
    bad = (host < 0) | (host >= codebook_size)
    bad[:, 0] &= host[:, 0] != eos_id
    return np.asarray(bad.any(axis=1))


@dataclass(frozen=True)
class FrameLimits:
    """What ends every stream of a model: its EOS code, length caps, and random weights' lengths."""

    eos_id: int
    max_new_tokens: int
    max_seq_len: int
    random_weights: bool  # no EOS to wait for: a stream's length follows its text
    random_frames_per_token: float


@dataclass
class HostSlot:
    text: TextStream
    language_id: int | None
    speaker_id: int | None
    instruct_ids: list[int]
    forced_frames: int | None  # StreamParams.forced_frames
    greedy: tuple[bool, bool]  # (codebook 0, codebooks 1..15): host copy of the device rows
    whole_text: bool  # wait for the end of the text and put all of it in the prompt (see prompt.py)
    guard: GuardLimits | None  # runaway limits (guards.py); None: a forced length, no guards
    voice: SlotVoice | None = None  # a cloned voice (Base; clone_prefill.py)
    words: TokenWords | None = None  # the word of each text id (None in whole-text mode: no reading order)
    words_reported: int = 0  # words already reported in a GenerateResult
    prefilled: bool = False
    frames: int = 0  # frames emitted
    position: int = 0  # talker positions written (KV length), counting the begun steps'
    begun: int = 0  # frames of begun steps whose codes are not recorded yet (Model.steps_in_flight)
    done: bool = False

    def prompt(self, cfg: Qwen3TTSConfig, role_ids: Sequence[int]) -> Prompt:
        """The talker prompt of the text so far (prompt.py; a cloned voice's own, clone_prefill.py)."""
        if self.voice is not None:
            return self.voice.prompt(cfg, role_ids, self.text.ids, self.language_id, self.whole_text)
        return build_prompt(
            cfg,
            role_ids,
            self.text.ids,
            self.language_id,
            self.speaker_id,
            self.instruct_ids,
            whole_text=self.whole_text,
        )

    def fed_ids(self) -> list[int]:
        """The slot's device text queue: entry k is fed with frame k (an in-context voice shifts it)."""
        return self.text.ids if self.voice is None else self.voice.fed_ids(self.text.ids)

    def ready(self, limits: FrameLimits) -> bool:
        """Model.ready: a step begun now would make progress for this slot (after the begun ones)."""
        if self.done or self.position >= limits.max_seq_len:  # no KV row left for another feed
            return False
        forced = self.forced(limits)
        if forced is not None and self.frames + self.begun >= forced:
            return False
        if not self.prefilled:
            if self.whole_text:
                return self.text.final
            if self.voice is not None:
                return self.voice.prefill_ready(len(self.text.ids), self.text.final)
            return bool(self.text.ids) or self.text.final
        # the feed after frame k-1 carries text token k (of the queue: see fed_ids)
        shift = 0 if self.voice is None else self.voice.text_shift
        return self.text.final or len(self.text.ids) + shift > self.frames + self.begun  # (whole text: final already)

    def forced(self, limits: FrameLimits) -> int | None:
        if self.forced_frames is not None:
            return self.forced_frames
        if limits.random_weights and self.text.final:
            return max(1, round(limits.random_frames_per_token * len(self.text.ids)))
        return None

    def record(
        self, slot: int, frame: np.ndarray, code0: int, looped: bool, limits: FrameLimits, invalid: bool = False
    ) -> GenerateResult:
        """One frame of this slot, (1, 16) codes, which the result keeps as they are (the caller's to
        hand over: a row of the step's own copy), ``code0`` its codebook-0 code; ``looped``: that
        code repeats (guards.py); ``invalid``: a code the codec cannot decode (``invalid_rows``),
        which ends the stream with an error. A frame of a step begun before an earlier one ended the
        stream is dropped."""
        self.begun -= 1
        if invalid:
            log.error("slot %d: invalid codes %s (frame %d)", slot, frame.tolist(), self.frames)
            self.done = True
            return GenerateResult(slot, None, 0, True, error="the model produced invalid codes")
        if self.done:
            return GenerateResult(slot, None, 0, True)
        if code0 == limits.eos_id:
            self.done = True
            return GenerateResult(slot, None, 0, True)
        self.frames += 1
        words = self.words_read()
        forced = self.forced(limits)
        if forced is not None and self.frames >= forced:
            self.done = True
            return GenerateResult(slot, frame, 1, True, words=words)
        guard = self.guard
        self.done = (
            self.frames >= limits.max_new_tokens
            or self.position + 1 > limits.max_seq_len  # no room for the next feed
            or (guard is not None and looped)
            or (guard is not None and self.text.final and self.frames >= guard.frame_budget(len(self.text.ids)))
        )
        return GenerateResult(slot, frame, 1, self.done, stop_reason="length" if self.done else None, words=words)

    def words_read(self) -> tuple[WordTiming, ...]:
        """Words whose first text token the frame just made was fed with (frame k reads token k of
        the queue, see fed_ids): each spans the frames that read its tokens, from this one. This is
        where the talker read the word, not where its voice says it: the audio trails the reading by
        the talker's lag (not measured here: random weights), so starts are early, never late."""
        w = self.words
        if w is None:
            return ()
        k = self.frames - 1  # the frame just made
        shift = 0 if self.voice is None else self.voice.text_shift
        if self.words_reported >= len(w.words) or w.first_token[self.words_reported] + shift > k:
            return ()  # most frames: no word starts here
        out = []
        while self.words_reported < len(w.words) and max(0, w.first_token[self.words_reported] + shift) <= k:
            i = self.words_reported
            start = max(0, w.first_token[i] + shift) - k  # 0, or < 0 for a word read before (clamped)
            out.append(WordTiming(w.words[i], start, start + max(1, w.token_counts[i])))
            self.words_reported += 1
        return tuple(out)
