"""How close the embedded voice's word timings are to the audio: shared by its test and by
``benchmarks/word_timing.py`` (which records the figures).

Two references:

- known boundaries: a turn of one-word sentences. The voice leaves a 250 ms pause after each, so
  every word's onset is the first audible 10 ms window (the one onset rule, ``first_audible_sample``)
  after a stretch of silence; those onsets, in order, are the truth for the reported starts.
- continuous speech: faster-whisper tiny.en with ``word_timestamps=True``, words paired in order
  by their spelling. Whisper is no ground truth: on the one-word sentences its starts are
  hundreds of ms late (``whisper_on_known_*``), and on continuous speech ours come a median
  ~55 ms before its own.
"""

from __future__ import annotations

import asyncio
import difflib
import re
from dataclasses import dataclass

import numpy as np

from voicewire.engine import ONSET_THRESHOLD_DBFS, Engine, WordTiming, first_audible_sample

RATE_HZ = 24_000
WINDOW = RATE_HZ // 100  # the onset rule's 10 ms window
MIN_GAP_S = 0.12  # silence before an onset that counts as a word boundary (the voice leaves 250 ms)

ONE_WORD_TURNS = (
    "Yes. Right. Seven. Hello. Banana. Tomorrow. Maybe. Wonderful. Okay. Twelve.",
    "Coffee. Music. Seriously. Paris. Thanks. Nothing. Elephant. Quickly. Sure. Forty.",
    "Listen. Actually. Monday. Perfect. Window. Absolutely. Goodbye. Three. Orange. Later.",
)
CONTINUOUS_TURNS = (
    "Your order number is 4,521 and it will arrive on Tuesday between nine and eleven in the morning.",
    "Would you like me to book a table for two at the Italian restaurant near the station tonight?",
    "The meeting was moved to Thursday because the client asked for more time, and the team agreed "
    "that the delay would help them finish the prototype before the demonstration.",
    "Did you know that the distance from the Earth to the Moon is about 384,000 kilometers?",
)


@dataclass(frozen=True)
class Spoken:
    pcm: np.ndarray  # the turn's audio, float32 at RATE_HZ
    words: tuple[WordTiming, ...]  # as the engine reported them, samples from the first


async def speak(engine: Engine, text: str) -> Spoken:
    stream = engine.open_stream(seed=7)  # the voice's noise fixed: the same audio every run
    stream.push_text(text)
    stream.end()
    pcm, words = [], []
    async for chunk in stream:
        pcm.append(chunk.pcm)
        words += chunk.words
    return Spoken(np.concatenate(pcm), tuple(words))


def onsets_after_silence(pcm: np.ndarray) -> list[int]:
    """Start of each audible 10 ms window that follows at least MIN_GAP_S of quiet windows (and the first)."""
    n = pcm.size // WINDOW
    power = np.mean(np.square(pcm[: n * WINDOW].reshape(n, WINDOW), dtype=np.float64), axis=1)
    loud = power > 10.0 ** (ONSET_THRESHOLD_DBFS / 10.0)
    gap = int(MIN_GAP_S * 100)
    out, quiet = [], gap
    for i, is_loud in enumerate(loud):
        if is_loud and quiet >= gap:
            out.append(i * WINDOW)
        quiet = 0 if is_loud else quiet + 1
    first = first_audible_sample(pcm, RATE_HZ, ONSET_THRESHOLD_DBFS)
    if first is not None and (not out or out[0] != first):
        out.insert(0, first)
    return out


def known_boundary_errors_ms(spoken: list[Spoken]) -> list[float]:
    """|reported start - onset| of every word of the one-word-sentence turns (ms)."""
    errors: list[float] = []
    for s in spoken:
        truth = onsets_after_silence(s.pcm)
        assert len(truth) == len(s.words), f"{len(truth)} onsets for {len(s.words)} words"
        errors += [abs(w.start - t) * 1000 / RATE_HZ for w, t in zip(s.words, truth, strict=True)]
    return errors


def _norm(word: str) -> str:
    return re.sub(r"[^a-z0-9]", "", word.lower())


def whisper_starts_s(spoken: Spoken) -> list[float | None]:
    """Whisper's start of each of our words (None where it spelled none the same way)."""
    from tests.asr import _model, to_16k

    segments, _ = _model().transcribe(
        to_16k(spoken.pcm, RATE_HZ), language="en", beam_size=1, temperature=0.0,
        word_timestamps=True, condition_on_previous_text=False,
    )  # fmt: skip
    heard = [(w.word, w.start) for seg in segments for w in (seg.words or [])]
    ours = [_norm(w.word) for w in spoken.words]
    matcher = difflib.SequenceMatcher(None, ours, [_norm(w) for w, _ in heard], autojunk=False)
    out: list[float | None] = [None] * len(ours)
    for block in matcher.get_matching_blocks():
        for k in range(block.size):
            out[block.a + k] = heard[block.b + k][1]
    return out


def whisper_differences_ms(spoken: Spoken) -> list[float]:
    """reported start - Whisper's start, for the words both spell the same way (ms)."""
    starts = whisper_starts_s(spoken)
    return [(w.start / RATE_HZ - t) * 1000 for w, t in zip(spoken.words, starts, strict=True) if t is not None]


def whisper_known_errors_ms(spoken: list[Spoken]) -> list[float]:
    """|Whisper's start - onset| on the one-word-sentence turns: Whisper's own resolution (ms)."""
    out: list[float] = []
    for s in spoken:
        truth = onsets_after_silence(s.pcm)
        starts = whisper_starts_s(s)
        out += [abs(t / RATE_HZ - w) * 1000 for t, w in zip(truth, starts, strict=True) if w is not None]
    return out


def measure(engine: Engine) -> dict[str, float | int]:
    async def run() -> tuple[list[Spoken], list[Spoken]]:
        return (
            [await speak(engine, t) for t in ONE_WORD_TURNS],
            [await speak(engine, t) for t in CONTINUOUS_TURNS],
        )

    known, continuous = asyncio.run(run())
    errors = known_boundary_errors_ms(known)
    whisper_known = whisper_known_errors_ms(known)
    signed = [d for s in continuous for d in whisper_differences_ms(s)]
    whisper = [abs(d) for d in signed]
    words = sum(len(s.words) for s in continuous)
    return {
        "known_words": len(errors),
        "known_median_ms": round(float(np.median(errors)), 1),
        "known_p90_ms": round(float(np.percentile(errors, 90)), 1),
        "known_max_ms": round(float(np.max(errors)), 1),
        "whisper_on_known_median_ms": round(float(np.median(whisper_known)), 1),
        "whisper_on_known_p90_ms": round(float(np.percentile(whisper_known, 90)), 1),
        "continuous_words": words,
        "whisper_matched_words": len(whisper),
        "whisper_median_ms": round(float(np.median(whisper)), 1),
        "whisper_p90_ms": round(float(np.percentile(whisper, 90)), 1),
        # < 0: our starts come before Whisper's (Whisper marks starts late: see whisper_on_known)
        "whisper_signed_median_ms": round(float(np.median(signed)), 1),
    }
