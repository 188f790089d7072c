"""Turns a stream of LLM text deltas into the pieces a model can speak.

Two feeders, one per ``TextGranularity``:

* ``ClauseFeeder`` for models that need whole phrases (the embedded voice). It cuts at clause
  punctuation and releases a short first fragment early: the first "Sure," of a turn is spoken
  while the LLM is still writing the rest of the sentence. Later clauses are merged up to a
  minimum length, because a TTS needs context for prosody.
* ``WordFeeder`` for models that read streaming text token by token (Qwen3-TTS): it releases
  complete words (the text up to the last whitespace), so a tokenizer never sees half a word.

Both pass every delta through a ``TextGuard`` first (bounded marks, no run without a boundary),
and no clause ``ClauseFeeder`` releases is longer than ``max_clause_chars``, whatever arrives in
one delta: what one piece costs a model is bounded before the model sees it.

Both are plain Python, no model, no clock: fed a delta, they return what became speakable.
"""

from __future__ import annotations

import re

from .config import TextConfig
from .text_guard import TextGuard, cut_to_length

# Punctuation that ends a clause when followed by whitespace (or the end of the text, see below).
_STRONG = ".!?…"
_WEAK = ",;:—"
_CLOSERS = "\"'”’)]"
# Words that start a phrase: the first fragment of a turn may end before one of them
# ("Your appointment is confirmed | for Tuesday"), so speech starts without waiting for punctuation.
_PHRASE_STARTS = frozenset(
    "and but or so because for at in on with from by about after before until while when where which who "
    "if than".split()
)
# A period after these is not a sentence end ("Dr. Smith", "e.g. this").
_ABBREVIATIONS = frozenset(
    [
        "mr",
        "mrs",
        "ms",
        "dr",
        "st",
        "jr",
        "sr",
        "vs",
        "etc",
        "prof",
        "inc",
        "ltd",
        "co",
        "mt",
        "no",
        "fig",
        "approx",
        "dept",
        "est",
        "e.g",
        "i.e",
        "a.m",
        "p.m",
        "u.s",
    ]
)


def _word_before(text: str, end: int) -> str:
    start = max(text.rfind(" ", 0, end), text.rfind("\n", 0, end)) + 1
    return text[start:end].strip("\"'“‘([").lower()


def _is_boundary(text: str, i: int) -> bool:
    """Is ``text[i]`` (a punctuation mark) the end of a clause?"""
    ch = text[i]
    nxt = text[i + 1] if i + 1 < len(text) else ""
    prev = text[i - 1] if i > 0 else ""
    if nxt and not nxt.isspace():
        return False  # "3.14", "1,000", "e.g.this", "U.S."
    if ch in _WEAK:
        # "1,000" is excluded above; a comma after a word is a pause even at the end of the buffer.
        return bool(prev) and (prev.isalpha() or prev in _CLOSERS)
    if ch in "!?…":
        return True
    # A period: not after an abbreviation or a single capital initial ("J. K. Rowling").
    word = _word_before(text, i)
    if word in _ABBREVIATIONS or (len(word) == 1 and word.isalpha()):
        return False
    if not nxt:
        # End of the buffer: "costs $29." could become "$29.99"; a period after a word cannot.
        return prev.isalpha()
    return True


class ClauseFeeder:
    """Delta text in, speakable clauses out."""

    def __init__(self, config: TextConfig) -> None:
        self._cfg = config
        self._guard = TextGuard(config)
        self._buf = ""
        self._released_any = False

    @property
    def pending(self) -> str:
        return self._buf

    def feed(self, delta: str) -> list[str]:
        self._buf += self._guard.feed(delta)
        return self._cut(final=False)

    def flush(self) -> list[str]:
        """Speak what is buffered now, even mid-clause."""
        return self._cut(final=True)

    def _cut(self, final: bool) -> list[str]:
        out: list[str] = []
        start = 0
        text = self._buf
        i = 0
        while i < len(text):
            ch = text[i]
            end = -1
            if ch == "\n":
                end = i
            elif (ch in _STRONG or ch in _WEAK) and _is_boundary(text, i):
                end = i + 1
                while end < len(text) and text[end] in _CLOSERS:
                    end += 1
            if end >= 0:
                piece = text[start:end].strip()
                strong = ch in _STRONG or ch == "\n"
                if piece and self._long_enough(piece, strong):
                    out.extend(self._first_split(piece) if not self._released_any else [piece])
                    self._released_any = True
                    start = end
                i = max(i + 1, end)
                continue
            i += 1
        rest = text[start:]
        if final:
            if rest.strip():
                out.extend(self._first_split(rest.strip()) if not self._released_any else [rest.strip()])
                self._released_any = True
            rest = ""
        else:
            # One delta may hold many clauses' worth of text with no punctuation.
            while (forced := self._force_cut(rest)) is not None:
                out.append(forced[0].strip())
                self._released_any = True
                rest = forced[1]
        self._buf = rest
        return [q for p in out for q in cut_to_length(p, self._cfg.max_clause_chars)]

    def _long_enough(self, piece: str, strong: bool) -> bool:
        if not self._released_any:
            # First fragment of the turn: out as soon as it is a real word or two ("Sure," / "Hello,").
            return len(piece) >= self._cfg.first_fragment_min_chars or strong
        return strong or len(piece) >= self._cfg.clause_min_chars

    def _first_split(self, piece: str) -> list[str]:
        """A long first clause is spoken in two parts: the first ends before a phrase-starting word."""
        words = piece.split()
        i = self._phrase_cut(words, len(words) - 1)
        if i is None or len(words) < self._cfg.first_fragment_min_words * 2:
            return [piece]
        return [" ".join(words[:i]), " ".join(words[i:])]

    def _phrase_cut(self, words: list[str], complete: int) -> int | None:
        """Index of the first phrase-starting word after the first few, among ``complete`` words."""
        for i in range(self._cfg.first_fragment_min_words, min(complete, self._cfg.first_fragment_max_words)):
            if words[i].lower() in _PHRASE_STARTS:
                return i
        return None

    def _force_cut(self, rest: str) -> tuple[str, str] | None:
        """No punctuation yet: cut the first fragment before a phrase-starting word as soon as that
        word is complete, or cut any clause after its last complete word within the length limit
        once it is too long (hard at the limit when it has no word boundary at all)."""
        words = rest.split()
        complete = len(words) if rest[-1:].isspace() else len(words) - 1
        if not self._released_any:
            i = self._phrase_cut(words, complete)
            if i is not None:
                return " ".join(words[:i]), rest[rest.index(words[i], len(" ".join(words[:i]))) :]
        too_many_words = not self._released_any and complete >= self._cfg.first_fragment_max_words
        if not (too_many_words or len(rest) >= self._cfg.max_clause_chars):
            return None
        limit = self._cfg.max_clause_chars
        cut = rest.rfind(" ", 0, limit + 1) if len(rest) > limit else rest.rfind(" ")
        if cut <= 0:
            return (rest[:limit], rest[limit:]) if len(rest) >= limit else None
        return rest[:cut], rest[cut + 1 :]


_LAST_WORD_END = re.compile(r"\s(?=\S*\Z)")  # the last whitespace: only non-whitespace after it


class WordFeeder:
    """Delta text in, complete words out (with their trailing whitespace), for token-level models."""

    def __init__(self, config: TextConfig | None = None) -> None:
        self._guard = TextGuard(config or TextConfig())
        self._buf = ""

    @property
    def pending(self) -> str:
        return self._buf

    def feed(self, delta: str) -> list[str]:
        self._buf += self._guard.feed(delta)
        m = _LAST_WORD_END.search(self._buf)
        if m is None:
            return []
        last_space = m.start()
        done, self._buf = self._buf[: last_space + 1], self._buf[last_space + 1 :]
        return [done] if done.strip() else []

    def flush(self) -> list[str]:
        done, self._buf = self._buf, ""
        return [done] if done.strip() else []
