"""The embedded voice's word timings, planned before a network call and placed after it.

Before: a clause's words matched to hibari's G2P words (``match_words``: the normalizer's rewrites
share their run's time) and to the phoneme ids of each network call (``plan_calls``). After: the
duration predictor's frames per id put each word in samples of the call's audio
(``word_samples``). hibari_voice.py runs both around its calls.
"""

from __future__ import annotations

import difflib
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..text_guard import cut_to_length
from ..word_timing import WordTiming

# A phoneme is heard before the frames the duration predictor gives it: each 12.5 ms frame is an
# STFT window of +-25 ms, and the network's convolutions after the expansion smear its onset over
# neighbouring frames. Measured on 30 one-word sentences (words apart from the test's): the first
# audible 10 ms window (-45 dBFS) comes a median 50 ms (p10 35, p90 75) before the phoneme's first
# frame, so word times are moved that much earlier.
SOUND_LEAD_MS = 50.0
# Phonemes that are pauses, not sounds of a word: a word's time ends before them.
_PAUSE_PHONEMES = frozenset(" ;:,.!?—…\"“”()")


@dataclass(frozen=True)
class WordPlan:
    """Where one clause word's time will lie in a network call's output, before the call: the ids
    whose frames it spans, and the share of them it takes (a word of a run the normalizer rewrote
    as a whole takes part of the run's time)."""

    word: str
    first_id: int  # index into the call's ids
    end_id: int  # one past the last (== first_id: a word with no sound of its own)
    share: tuple[float, float] = (0.0, 1.0)


def _key(word: str) -> str:
    """What two spellings of a word share: its letters and digits, accents and case aside."""
    return "".join(ch for ch in unicodedata.normalize("NFKD", word).casefold() if ch.isalnum())


def match_words(clause_words: Sequence[str], g2p_words: Sequence[str]) -> list[tuple[int, int, float, float]]:
    """For each clause word, the G2P words that speak it: (first, end, share_lo, share_hi). Words
    the normalizer left alone match one to one; a run it rewrote ("7:30" -> "seven thirty") is
    shared by length among the clause words of the run; a clause word it dropped gets (j, j)."""
    out: list[tuple[int, int, float, float]] = [(0, 0, 0.0, 0.0)] * len(clause_words)
    keys = [_key(w) for w in clause_words]
    matcher = difflib.SequenceMatcher(None, keys, [_key(w) for w in g2p_words], autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            for k in range(i2 - i1):
                out[i1 + k] = (j1 + k, j1 + k + 1, 0.0, 1.0)
        elif tag in ("replace", "delete"):
            weights = [max(1, len(keys[i])) for i in range(i1, i2)]
            total, before = sum(weights), 0
            for k, weight in enumerate(weights):
                lo, hi = before / total, (before + weight) / total
                out[i1 + k] = (j1, j2, lo, hi) if j2 > j1 else (j1, j1, 0.0, 0.0)
                before += weight
        # "insert": G2P words with no clause word (an expansion's extra words) are left as pauses
    return out


def plan_calls(
    phonemes: str,
    spans: list[tuple[str, int, int]],
    clause_words: list[str],
    vocab: dict[str, int],
    max_phonemes: int,
    first_max: int | None = None,
) -> list[tuple[str, list[WordPlan]]]:
    """One sentence's phonemes in network calls of at most ``max_phonemes`` (the first of at most
    ``first_max``), cut between G2P words, each with the plans of the clause words whose sound
    starts in it."""
    groups: list[list[int]] = []  # G2P word indices per call
    begin = 0
    first_max = first_max or max_phonemes
    for j, (_, a, b) in enumerate(spans):
        if not groups or b - begin > (first_max if len(groups) == 1 else max_phonemes):
            groups.append([])
            begin = a
        groups[-1].append(j)
    group_of = {j: g for g, group in enumerate(groups) for j in group}
    matches = match_words(clause_words, [w for w, _, _ in spans])
    plans: list[list[WordPlan]] = [[] for _ in groups]
    texts: list[list[str]] = []
    for g, group in enumerate(groups):
        raw = phonemes[spans[group[0]][1] : spans[group[-1]][2]]
        lead = len(raw) - len(raw.lstrip())
        # more than one piece: one huge G2P word
        pieces = cut_to_length(raw, first_max if g == 0 else max_phonemes) or [""]
        texts.append(pieces)
        id_of = np.cumsum([1] + [ch in vocab for ch in pieces[0]])  # id of each character: [0, ...vocab chars, 0]
        base = spans[group[0]][1] + lead

        def sound_ids(j: int, text: str = pieces[0], id_of: np.ndarray = id_of, base: int = base) -> tuple[int, int]:
            a, b = max(0, spans[j][1] - base), max(0, min(spans[j][2] - base, len(text)))
            sounds = [i for i in range(a, b) if text[i] in vocab and text[i] not in _PAUSE_PHONEMES]
            if not sounds:
                at = int(id_of[min(a, len(text))])
                return at, at
            return int(id_of[sounds[0]]), int(id_of[sounds[-1]]) + 1

        for word, (j1, j2, lo, hi) in zip(clause_words, matches, strict=True):
            if group_of.get(j1, len(groups) - 1) != g:
                continue
            if j2 > j1:
                first = sound_ids(j1)[0]
                end = sound_ids(max(j for j in range(j1, j2) if group_of[j] == g))[1]
            else:  # no sound of its own: a point where the next G2P word starts (or at the end)
                first = end = sound_ids(j1)[0] if j1 in group_of else int(id_of[-1])
            plans[g].append(WordPlan(word, first, max(first, end), (lo, hi)))
    return [
        (piece, plans[g] if k == 0 else [])
        for g, pieces in enumerate(texts)
        for k, piece in enumerate(pieces)
        if piece
    ]


def word_samples(
    plans: Sequence[WordPlan], durations: np.ndarray, n_samples: int, sample_rate_hz: int
) -> tuple[WordTiming, ...]:
    """The plans of one call in samples of its synthesized audio: id ``i`` lasts ``durations[i]``
    units of the duration predictor, which the network expands to ``n_samples`` in all."""
    total = int(durations.sum())
    if total <= 0:
        return ()
    edges = np.concatenate([[0], np.cumsum(durations)]) * (n_samples / total)  # sample where each id starts
    edges = np.maximum(0.0, edges - sample_rate_hz * SOUND_LEAD_MS / 1000)
    out = []
    for p in plans:
        a, b = float(edges[min(p.first_id, durations.size)]), float(edges[min(p.end_id, durations.size)])
        lo, hi = a + (b - a) * p.share[0], a + (b - a) * p.share[1]
        out.append(WordTiming(p.word, round(lo), round(hi)))
    return tuple(out)
