"""Barge-in truncation: which words of a turn were spoken by the time its audio stopped.

The engine tells which text each audio chunk speaks (a clause for the embedded voice, a few
words for Qwen3-TTS), not when each word starts. So the text spoken up to ``played`` samples is:

- every chunk that played to its end, whole;
- in the chunk that was playing, an estimate: its words are laid over the chunk's voiced part
  (first to last 10 ms window above the onset threshold, so the lead-in and the 120-250 ms pause
  the embedded voice leaves after a clause do not count as words) in proportion to their length
  in characters, and a word counts as spoken once half of it has played.

On the embedded voice the estimate is within about one word: its speaking rate varies less than
2x per character within a clause. It is what ``turn.done`` reports as ``text_spoken`` so an agent
can truncate its context to what the listener heard (OpenAI's ``conversation.item.truncate``
does the same with ``audio_end_ms``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from voicewire.engine import first_audible_sample


@dataclass(frozen=True)
class TextSpan:
    """The text one audio chunk speaks, and where that chunk lies in the turn (engine samples)."""

    text: str
    start_sample: int  # first sample of the chunk in the turn's audio
    end_sample: int  # one past its last sample
    voiced_start_sample: int  # first audible 10 ms window (start_sample if none)
    voiced_end_sample: int  # end of the last audible 10 ms window (end_sample if none)

    @classmethod
    def of_chunk(
        cls, text: str, pcm: np.ndarray, start_sample: int, sample_rate_hz: int, threshold_dbfs: float
    ) -> TextSpan:
        end = start_sample + pcm.size
        onset = first_audible_sample(pcm, sample_rate_hz, threshold_dbfs)
        if onset is None:
            return cls(text, start_sample, end, start_sample, end)
        # The same detector run backwards finds the start of the last loud window from the end.
        offset = first_audible_sample(pcm[::-1], sample_rate_hz, threshold_dbfs) or 0
        return cls(text, start_sample, end, start_sample + onset, end - offset)


def spoken_words(text: str, fraction: float) -> str:
    """The words of ``text`` spoken once ``fraction`` (0..1) of its voiced audio has played."""
    words = text.split()
    if fraction <= 0.0 or not words:
        return ""
    if fraction >= 1.0:
        return " ".join(words)
    total_chars = sum(len(w) for w in words)
    kept: list[str] = []
    before = 0
    for w in words:
        if (before + len(w) / 2) / total_chars > fraction:
            break
        kept.append(w)
        before += len(w)
    return " ".join(kept)


def spoken_text(spans: list[TextSpan], played_samples: int) -> str:
    """Text spoken by the first ``played_samples`` samples of a turn (an estimate inside a chunk)."""
    out: list[str] = []
    for span in spans:
        if played_samples >= span.end_sample:
            out.append(span.text.strip())
            continue
        voiced = span.voiced_end_sample - span.voiced_start_sample
        if voiced > 0 and played_samples > span.voiced_start_sample:
            part = spoken_words(span.text, (played_samples - span.voiced_start_sample) / voiced)
            if part:
                out.append(part)
        break
    return " ".join(t for t in out if t)
