import random
import unicodedata

import pytest

from voicewire.engine.config import TextConfig
from voicewire.engine.text_guard import TextGuard, cut_to_length


def guard(**kwargs: int) -> TextGuard:
    return TextGuard(TextConfig(**kwargs))


@pytest.mark.parametrize(
    "text",
    [
        "Sure, I can help you with that booking today.",
        "It costs $29.99 today, and Dr. Smith paid 1,000 dollars.\nNew line\ttab\r\n",
        "Café crème, naïve façade — “quoted” ‘text’… 3.14 ½ °C",
        "Привет мир, 日本語のテキスト, ελληνικά, עברית, हिन्दी",
        "https://example.com/some/path?x=1&y=2 john.smith@example.com",
    ],
)
def test_ordinary_text_passes_unchanged(text: str) -> None:
    assert guard().feed(text) == unicodedata.normalize("NFC", text)


def test_decomposed_accents_are_composed() -> None:
    assert guard().feed("Cafe\u0301") == "Café"


def test_invisible_and_unassigned_code_points_are_dropped() -> None:
    text = "a\x00b\x1bc\u200dd\u202ee\ufefff\ue000g\U0010fffdh\U000e0001i"  # Cc, Cf, Co, Co, Cf
    assert guard().feed(text) == "abcdefghi"
    assert guard().feed("a\u0378b") == "ab"  # unassigned


def test_other_whitespace_becomes_a_space_or_a_newline() -> None:
    assert guard().feed("a\u00a0b\u2003c\u200bd\u2028e\x85f") == "a b c d\ne\nf"


def test_combining_marks_are_capped_per_base_character() -> None:
    out = guard(max_marks_per_char=2).feed("a" + "\u0301\u0302\u0303" * 1000 + " b\u0308\u0323\u0304")
    # NFC first composes what it can ("a" + acute -> "á"); the cap counts the marks left over.
    assert out == "á\u0302\u0303 ḅ\u0308\u0304"
    # The cap holds across deltas.
    g = guard(max_marks_per_char=2)
    assert g.feed("o\u0301\u0302") + g.feed("\u0303\u0304") == "ó\u0302\u0303"


def test_a_run_without_whitespace_is_cut_at_the_limit_across_deltas() -> None:
    g = guard(max_word_chars=8)
    out = "".join(g.feed(d) for d in ["abc", "defgh", "ijklmnopq", "rs tuvw"])
    assert out == "abcdefgh ijklmnop qrs tuvw"
    emoji = guard(max_word_chars=64).feed("😀" * 8000)
    assert max(len(run) for run in emoji.split(" ")) == 64
    assert emoji.replace(" ", "") == "😀" * 8000


def test_a_cut_never_separates_a_letter_from_its_marks() -> None:
    out = guard(max_word_chars=4, max_marks_per_char=4).feed("e\u0323\u0302" * 6)  # NFC: ệ, one code point
    assert out == "ệệệệ ệệ"
    out = guard(max_word_chars=3, max_marks_per_char=4).feed("q\u0301\u0302" * 3)  # no precomposed form
    assert out.split(" ") == ["q\u0301\u0302", "q\u0301\u0302", "q\u0301\u0302"]


def test_cut_to_length_prefers_the_last_space_and_cuts_hard_without_one() -> None:
    assert cut_to_length("one two three four", 9) == ["one two", "three", "four"]
    assert cut_to_length("x" * 25, 10) == ["x" * 10, "x" * 10, "x" * 5]
    assert cut_to_length("  short  ", 10) == ["short"]
    assert cut_to_length("", 10) == []
    pieces = cut_to_length("word " * 500, 300)
    assert all(len(p) <= 300 for p in pieces) and " ".join(pieces) == ("word " * 500).strip()


def test_plain_ascii_takes_the_shortcut_to_the_same_text_and_state() -> None:
    """Printable ASCII skips the per-character loop: the same output and the same carried run, for
    runs up to, at and past the limit, across deltas."""
    rnd = random.Random(0)
    alphabet = "ab .,\t\n\rxyz-'"
    for max_word_chars in (0, 1, 3, 8):
        fast, slow = guard(max_word_chars=max_word_chars), guard(max_word_chars=max_word_chars)
        slow.feed = slow._feed_chars  # type: ignore[method-assign]
        for _ in range(400):
            delta = "".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 12)))
            assert fast.feed(delta) == slow.feed(delta), (max_word_chars, delta)
            assert (fast._run_chars, fast._marks) == (slow._run_chars, slow._marks)
        assert fast.feed("e\u0301") == slow.feed("e\u0301")  # not ASCII: the loop for both
