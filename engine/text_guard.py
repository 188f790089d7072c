"""Bounds what one piece of text can cost, before any model sees it. Model-independent.

A text-to-speech front end (tokenizer, G2P, phonemizer) is written for prose: words separated by
spaces, a few accents per letter. Given 8,000 emoji with no space, or a letter carrying 4,000
combining accents, a phonemizer's cost can grow with the square or cube of the run length, and a
clause feeder that cuts at word boundaries has nowhere to cut. ``TextGuard`` makes every delta
safe to cut and cheap to read, per stream and across deltas:

* NFC, so accents arrive composed where Unicode can compose them;
* control, format, private-use, unassigned and surrogate code points are dropped (they carry no
  sound); line and paragraph separators become ``\\n``, other whitespace and U+200B a space;
* at most ``max_marks_per_char`` combining marks are kept on one base character;
* a run of ``max_word_chars`` characters with no whitespace gets a space before the next
  character, so a feeder always finds a boundary.

Plain Python, no model, no clock. Ordinary prose passes through unchanged. NFC runs per delta: an
accent that arrives in the delta after its letter stays decomposed, which sounds the same.
"""

from __future__ import annotations

import re
import unicodedata

from .config import TextConfig

_DROPPED_CATEGORIES = frozenset(("Cc", "Cf", "Cn", "Co", "Cs"))
_KEPT_WHITESPACE = frozenset(" \t\n\r")
_TO_NEWLINE = frozenset("\u2028\u2029\x85\x0b\x0c")  # line/paragraph breaks by another name
_TO_SPACE = frozenset("\u200b")  # zero-width space: a word boundary in scripts without spaces
_PLAIN = re.compile(r"[\x20-\x7e\t\n\r]*")  # printable ASCII and the kept whitespace
_ASCII_SPACE = re.compile(r"[ \t\n\r]")  # the only whitespace in such text


class TextGuard:
    """Delta text in, bounded text out (see the module docstring)."""

    def __init__(self, config: TextConfig) -> None:
        self._max_run = config.max_word_chars
        self._max_marks = config.max_marks_per_char
        self._run_chars = 0  # characters since the last whitespace, carried across deltas
        self._marks = 0  # combining marks kept on the current base character

    def feed(self, delta: str) -> str:
        if _PLAIN.fullmatch(delta):
            plain = self._feed_plain(delta)
            if plain is not None:
                return plain
        return self._feed_chars(delta)

    def _feed_chars(self, delta: str) -> str:
        """``feed``, a character at a time."""
        out: list[str] = []
        for ch in unicodedata.normalize("NFC", delta):
            if ch in _KEPT_WHITESPACE or ch in _TO_NEWLINE or ch in _TO_SPACE or ch.isspace():
                out.append(ch if ch in _KEPT_WHITESPACE else "\n" if ch in _TO_NEWLINE else " ")
                self._run_chars = self._marks = 0
                continue
            category = unicodedata.category(ch)
            if category in _DROPPED_CATEGORIES:
                continue
            if category[0] == "M":
                if self._marks >= self._max_marks:
                    continue
                self._marks += 1
            else:
                # Cut before a base character, never between a letter and its accents.
                if self._run_chars >= self._max_run:
                    out.append(" ")
                    self._run_chars = 0
                self._marks = 0
            out.append(ch)
            self._run_chars += 1
        return "".join(out)

    def _feed_plain(self, delta: str) -> str | None:
        """``feed`` of printable ASCII text (most text): NFC leaves it alone, nothing in it is dropped
        or a mark, so it passes unchanged unless a run grows too long (None: ``feed`` cuts it)."""
        runs = _ASCII_SPACE.split(delta)  # runs[0] goes on from the last delta's run
        if self._run_chars + len(runs[0]) > self._max_run or any(len(r) > self._max_run for r in runs[1:]):
            return None
        if delta:
            self._marks = 0
            self._run_chars = self._run_chars + len(runs[0]) if len(runs) == 1 else len(runs[-1])
        return delta


def cut_to_length(text: str, max_chars: int) -> list[str]:
    """``text`` in pieces of at most ``max_chars``: each ends at its last space within the limit,
    or is cut hard at the limit where there is none. Pieces are stripped; empty ones dropped."""
    pieces: list[str] = []
    rest = text.strip()
    while len(rest) > max_chars:
        cut = rest.rfind(" ", 0, max_chars + 1)
        if cut <= 0:
            cut = max_chars
        pieces.append(rest[:cut].strip())
        rest = rest[cut:].strip()
    pieces.append(rest)
    return [p for p in pieces if p]
