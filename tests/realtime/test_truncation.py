"""The barge-in text estimate: whole chunks, then a proportional word cut over the voiced part."""

from __future__ import annotations

import numpy as np
import pytest

from voicewire.realtime.truncation import (
    SpokenRecord,
    SpokenWord,
    TextAligner,
    TextSpan,
    spoken_by_words,
    spoken_text,
    spoken_words,
)

pytestmark = pytest.mark.shared_cores  # the estimate's arithmetic: nothing timed

RATE_HZ = 24_000


def _chunk(lead_ms: float, voiced_ms: float, tail_ms: float) -> np.ndarray:
    n = [int(RATE_HZ * ms / 1000) for ms in (lead_ms, voiced_ms, tail_ms)]
    voiced = 0.3 * np.sin(np.arange(n[1]) * 2 * np.pi * 200 / RATE_HZ)
    return np.concatenate([np.zeros(n[0]), voiced, np.zeros(n[2])]).astype(np.float32)


def test_spoken_words_counts_a_word_once_half_of_it_played() -> None:
    text = "aaaa bbbb cccc dddd"  # 16 characters, each word a quarter
    assert spoken_words(text, 0.0) == ""
    assert spoken_words(text, 0.12) == ""
    assert spoken_words(text, 0.13) == "aaaa"
    assert spoken_words(text, 0.5) == "aaaa bbbb"
    assert spoken_words(text, 0.99) == "aaaa bbbb cccc dddd"
    assert spoken_words(text, 1.0) == text


def test_voiced_bounds_leave_out_lead_in_and_pause() -> None:
    span = TextSpan.of_chunk("hello there", _chunk(100, 800, 250), 1000, RATE_HZ, -45.0)
    assert span.start_sample == 1000
    assert abs(span.voiced_start_sample - (1000 + 2400)) <= 240  # within one 10 ms window
    assert abs(span.voiced_end_sample - (1000 + 2400 + 19_200)) <= 240
    assert span.end_sample == 1000 + 2400 + 19_200 + 6000


def test_spoken_text_whole_chunks_then_a_cut() -> None:
    a = TextSpan.of_chunk("Sure, I can help.", _chunk(10, 1000, 250), 0, RATE_HZ, -45.0)
    b = TextSpan.of_chunk("Your order shipped this morning.", _chunk(20, 1600, 250), a.end_sample, RATE_HZ, -45.0)
    spans = [a, b]
    assert spoken_text(spans, 0) == ""
    assert spoken_text(spans, a.end_sample - 100) == "Sure, I can help."  # only the pause is missing
    assert spoken_text(spans, a.end_sample) == "Sure, I can help."
    assert spoken_text(spans, b.voiced_start_sample) == "Sure, I can help."
    half = (b.voiced_start_sample + b.voiced_end_sample) // 2
    assert spoken_text(spans, half) == "Sure, I can help. Your order shipped"
    assert spoken_text(spans, b.end_sample) == "Sure, I can help. Your order shipped this morning."
    assert spoken_text(spans, 10**9) == spoken_text(spans, b.end_sample)


def test_spoken_words_are_found_in_the_text_the_client_sent() -> None:
    aligner = TextAligner()
    for delta in ("Hello, wor", "ld! Café ", "😀 costs $9.99", " — the the end"):
        aligner.push(delta)
    text = aligner.text
    # What the engine speaks: guarded, NFC, without the emoji; "Café" may come decomposed.
    spoken = ["Hello,", "world!", "Cafe\u0301", "costs", "$9.99", "—", "the", "the", "end"]
    spans = [aligner.locate(w) for w in spoken]
    assert [text[a:b] for a, b in spans] == ["Hello,", "world!", "Café", "costs", "$9.99", "—", "the", "the", "end"]
    assert spans[6] < spans[7]  # a repeated word is the next one, not the first again
    missing = TextAligner()
    missing.push("abc def")
    assert missing.locate("xyz") == (0, 0) and missing.locate("def") == (4, 7)  # not found: a point


def test_text_spoken_ends_at_the_last_word_half_played() -> None:
    text = "Sure, I can help."
    words = [SpokenWord("Sure,", 0, 100, 0, 5), SpokenWord("I", 150, 200, 6, 7), SpokenWord("can", 220, 400, 8, 11)]
    assert spoken_by_words(text, words, 49) == ""
    assert spoken_by_words(text, words, 50) == "Sure,"
    assert spoken_by_words(text, words, 309) == "Sure, I"
    assert spoken_by_words(text, words, 310) == "Sure, I can"


def test_a_finished_turns_record_cuts_at_the_position_and_at_its_audio() -> None:
    text = "Sure, I can help."
    words = (SpokenWord("Sure,", 0, 100, 0, 5), SpokenWord("I", 150, 200, 6, 7), SpokenWord("can", 220, 400, 8, 11))
    timed = SpokenRecord(text, words, (), 400)
    assert timed.text_spoken(180) == "Sure, I"
    assert timed.text_spoken(10**9) == "Sure, I can"  # the words its audio holds, no more
    a = TextSpan.of_chunk("Sure, I can help.", _chunk(10, 1000, 250), 0, RATE_HZ, -45.0)
    untimed = SpokenRecord(text, (), (a,), a.end_sample)
    assert untimed.text_spoken(a.end_sample) == "Sure, I can help."
    assert untimed.text_spoken((a.voiced_start_sample + a.voiced_end_sample) // 2) == spoken_text(
        [a], (a.voiced_start_sample + a.voiced_end_sample) // 2
    )
