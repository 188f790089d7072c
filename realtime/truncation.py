"""Barge-in truncation: which words of a turn were spoken by the time its audio stopped.

Where the model times its words (``AudioChunk.words``: the embedded voice from its duration
predictor, Qwen3-TTS from the frames that read each word), a word counts as spoken once the first
half of its time has played, and the text spoken is the turn's input text up to that word's end
(``TextAligner`` maps each spoken word back to the characters the client sent). ``turn.words``
carries the same words to the client.

Without word timings the engine tells only which text each audio chunk speaks. Then the text
spoken up to ``played`` samples is:

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

import unicodedata
from dataclasses import dataclass

import numpy as np

from voicewire.engine import first_audible_sample


@dataclass(frozen=True)
class SpokenWord:
    """One timed word of a turn: where it lies in the audio (engine samples from the turn's first)
    and in the turn's input text (characters, as the client sent them)."""

    word: str
    start_sample: int
    end_sample: int
    char_start: int
    char_end: int

    def describe(self, rate_hz: int) -> dict[str, object]:
        """The word as ``turn.words`` sends it."""
        return {
            "word": self.word,
            "start_ms": round(self.start_sample * 1000 / rate_hz, 2),
            "end_ms": round(self.end_sample * 1000 / rate_hz, 2),
            "char_start": self.char_start,
            "char_end": self.char_end,
        }


def _keys(text: str) -> list[str]:
    """Each character's letters and digits, accents and case aside ("É" -> "e", "ß" -> "ss")."""
    return ["".join(c for c in unicodedata.normalize("NFKD", ch).casefold() if c.isalnum()) for ch in text]


class TextAligner:
    """Finds the engine's spoken words, in order, in the text a client sent.

    The engine speaks the text after its guards (NFC, no control characters, long runs split) and
    the voice's own clean-up (no emoji), so a spoken word is found by its letters and digits from
    the end of the word before; what it skipped (emoji, markup) belongs to no word. A word with no
    letter or digit ("—") is searched as written, and sits at the cursor when not found nearby.
    """

    def __init__(self) -> None:
        self.text = ""
        # Letters and digits of the text not yet spoken, folded, and the character of ``text``
        # each comes from: what a word is searched in (the spoken part is dropped as it goes).
        self._stream = ""
        self._index: list[int] = []
        self._cursor = 0  # in ``text``: end of the last word found

    def push(self, delta: str) -> None:
        base = len(self.text)
        self.text += delta
        keys = _keys(delta)
        self._stream += "".join(keys)
        self._index += [base + i for i, key in enumerate(keys) for _ in key]

    def locate(self, word: str) -> tuple[int, int]:
        """(char_start, char_end) of the next occurrence of ``word``."""
        key = "".join(_keys(word))
        if not key:
            at = self.text.find(word.strip(), self._cursor, self._cursor + 8 + len(word))
            start, end = (at, at + len(word.strip())) if at >= 0 else (self._cursor, self._cursor)
        else:
            at = self._stream.find(key)
            if at < 0:
                return self._cursor, self._cursor
            start, end = self._index[at], self._index[at + len(key) - 1] + 1
            self._stream = self._stream[at + len(key) :]
            del self._index[: at + len(key)]
            # The word's own punctuation ("Hello," / "$9.99" / "(yes)") up to the whitespace around it.
            while start > self._cursor and not self.text[start - 1].isspace() and not _keys(self.text[start - 1])[0]:
                start -= 1
            while end < len(self.text) and not self.text[end].isspace() and not _keys(self.text[end])[0]:
                end += 1
        self._cursor = max(self._cursor, end)
        return start, end


def spoken_by_words(text: str, words: list[SpokenWord], played_samples: int) -> str:
    """The input text up to the last word whose first half lies within ``played_samples``."""
    end = 0
    for w in words:
        if played_samples * 2 < w.start_sample + w.end_sample:
            break
        end = w.char_end
    return text[:end].strip()


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


@dataclass(frozen=True)
class SpokenRecord:
    """What a finished turn spoke, kept so the client can still say how much of it played: a
    reply sent faster than real time is done on the server long before the listener barges in."""

    text: str  # the turn's input text, as the client sent it
    words: tuple[SpokenWord, ...]  # its timed words (empty where the model times none)
    spans: tuple[TextSpan, ...]  # the text of each audio chunk, for the estimate without words
    samples: int  # engine-rate samples of audio sent

    def text_spoken(self, played_samples: int) -> str:
        """The text the first ``played_samples`` samples spoke (capped at the audio sent)."""
        played = min(played_samples, self.samples)
        if self.words:
            return spoken_by_words(self.text, list(self.words), played)
        return spoken_text(list(self.spans), played)
