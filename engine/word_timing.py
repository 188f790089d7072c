"""Word timings: where each spoken word lies in a stream's audio.

A model reports the words it speaks as ``WordTiming``s. Their unit depends on where they are:

- in ``GenerateResult.words``: frames, from the result's first frame (a word may end in a later
  step's frames: Qwen3-TTS reports a word at the frame that reads its first token);
- in ``DecodeWork.words``: frames, from the chunk's first frame (the scheduler shifts them);
- in ``Decoded.words`` (what ``Model.decode_timed`` returns): samples of that chunk's PCM;
- in ``AudioChunk.words``: samples from the stream's first emitted sample (after the lead-in trim),
  the unit the gateway sends on.

Each word appears once, in the first chunk whose audio holds its start, so a transport that sends
a chunk's words before the chunk's audio never sends a word after its audio.

``TokenWords`` maps a streaming-text model's token ids to the words they spell (Qwen3-TTS reads one
token per frame, so the frame that reads a word's first token is where the word is reported).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple


class WordTiming(NamedTuple):
    """A tuple, not a dataclass: made and shifted a few times for each word, on the worker's thread
    every step, where a frozen dataclass's constructor costs twice a tuple's."""

    word: str  # the word as the model speaks it (the text it was given, whitespace-delimited)
    start: int  # first frame or sample (see the module docstring for the unit)
    end: int  # one past its last


def shifted(words: Sequence[WordTiming], by: int, scale: int = 1) -> list[WordTiming]:
    """``words`` with ``(x * scale + by)`` for start and end; starts never below 0, ends never
    before their start (a word cut into by a trim keeps its place at the cut)."""
    if not words:  # most chunks and frames: called a few times for each, every step
        return []
    if by == 0 and scale == 1 and all(0 <= w.start <= w.end for w in words):
        return list(words)  # nothing moves (a chunk after the lead-in trim): the same words
    out = []
    for word, start, end in words:
        start, end = start * scale + by, end * scale + by
        if start < 0:
            start = 0
        out.append(WordTiming(word, start, end if end > start else start))
    return out


class TokenWords:
    """Which word of a stream's text each of its token ids spells.

    ``add`` is given the text just tokenized (ending on a split-piece boundary) and its ids: BPE
    never merges across split pieces, so each piece's ids are its own, counted by encoding the
    piece alone. A piece belongs to the word holding its first non-space character; a piece of
    whitespace only (a newline token) to the word before it.
    """

    def __init__(
        self,
        split: Callable[[str], list[tuple[str, tuple[int, int]]]],
        encode: Callable[[str], list[int]],
    ) -> None:
        self._split = split
        self._encode = encode
        self.words: list[str] = []  # every word seen, in order
        self.first_token: list[int] = []  # the index of each word's first token id
        self.token_counts: list[int] = []  # ids per word
        self._open = False  # the last word may go on in the next text (no whitespace after it yet)
        self.n_tokens = 0

    def add(self, text: str, n_ids: int) -> None:
        pieces = [p for p, _ in self._split(text)] if text else []
        # one piece (a word streamed on its own) owns all the ids: no need to encode it again
        counts = [n_ids] if len(pieces) == 1 else [len(self._encode(p)) for p in pieces]
        if sum(counts) != n_ids:  # not expected (special tokens?): spread the ids over the pieces
            counts = [n_ids // len(pieces) + (i < n_ids % len(pieces)) for i in range(len(pieces))] if pieces else []
        for piece, count in zip(pieces, counts, strict=True):
            starts_word = piece[:1].isspace() or not self._open
            body = piece.strip()
            if not body:  # whitespace only: ends the word before it
                self._own(count)
                self._open = False
                continue
            if starts_word:
                self.words.append(body)
                self.first_token.append(self.n_tokens)
                self.token_counts.append(0)
            else:
                self.words[-1] += body
            self._own(count)
            self._open = not piece[-1:].isspace()
        if text[-1:].isspace():
            self._open = False

    def _own(self, count: int) -> None:
        if self.token_counts:
            self.token_counts[-1] += count
        self.n_tokens += count
