"""What the embedded voice's front end is given: ``speakable`` leaves prose alone and bounds the rest."""

from __future__ import annotations

import re

import pytest

from voicewire.engine.models.hibari_voice import MAX_NUMBER_DIGITS, MAX_RUN_CHARS, speakable


@pytest.mark.parametrize(
    "text",
    [
        "Sure, I can help you with that booking today.",
        "It costs $29.99 at 7:30 pm on 3/14/2025, or 1,234,567 yen; that's 25°C — ±2 × 3.",
        "Café crème and naïve “quotes”… https://example.com/path",
    ],
)
def test_prose_is_unchanged(text: str) -> None:
    assert speakable(text) == text


def test_what_an_english_voice_cannot_read_is_dropped() -> None:
    assert speakable("Great job! 🎉👍🏽 Thanks.") == "Great job!  Thanks."
    assert speakable("😀" * 100) == ""
    assert speakable("a" + "\u0301" * 4000) == "á"  # marks left after NFC carry nothing for English
    assert speakable("\x00\x1bok\u200d\ue000") == "ok"


def test_long_digit_runs_are_read_in_groups_of_three() -> None:
    assert speakable("1" * MAX_NUMBER_DIGITS) == "1" * MAX_NUMBER_DIGITS
    assert speakable("12345678901234567") == "12 345 678 901 234 567"
    assert speakable("1,234,567,890,123,456,789") == "1 234 567 890 123 456 789"
    groups = speakable("7" * 5000).split(" ")
    assert "".join(groups) == "7" * 5000 and max(len(g) for g in groups) == 3


def test_no_run_without_a_space_is_longer_than_the_limit() -> None:
    for text in ["a/" * 2000, "abcdefghij" * 400, "日本語Русский" * 300, "&@#%" * 500]:
        assert max(len(run) for run in speakable(text).split()) <= MAX_RUN_CHARS
    # A run is cut after punctuation where it has some within the limit.
    assert speakable("https://example.com/some/path/to/page") == "https://example.com/ some/path/to/page"
    assert re.fullmatch(r"(x{24} )+x{8}", speakable("x" * 80))
