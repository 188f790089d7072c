from voicewire.engine.config import TextConfig
from voicewire.engine.text_feeder import ClauseFeeder, WordFeeder


def feed_words(feeder: ClauseFeeder, text: str) -> list[list[str]]:
    """Feed word by word; returns what each delta released."""
    out = []
    words = text.split(" ")
    for i, w in enumerate(words):
        out.append(feeder.feed(w if i == len(words) - 1 else w + " "))
    return out


def test_first_fragment_released_at_first_clause_before_sentence_ends() -> None:
    f = ClauseFeeder(TextConfig())
    released = feed_words(f, "Sure, I can help you with that booking today.")
    assert released[0] == ["Sure,"]  # the comma after a word is a boundary at once
    # The rest waits for its sentence end, which the last word brings.
    assert all(r == [] for r in released[1:-1])
    assert released[-1] == ["I can help you with that booking today."]
    assert f.flush() == []


def test_sentence_end_releases_without_waiting_for_next_delta() -> None:
    f = ClauseFeeder(TextConfig())
    assert f.feed("Hello there.") == ["Hello there."]
    assert f.feed(" How are you?") == ["How are you?"]


def test_numbers_abbreviations_and_decimals_are_not_cut() -> None:
    f = ClauseFeeder(TextConfig())
    # "$29." may continue as "$29.99": no cut until the next character shows it is a sentence end.
    assert f.feed("It costs $29.") == []
    assert f.feed("99 today, and Dr. Smith paid 1,000 dollars. ") == [
        "It costs $29.99 today,",
        "and Dr. Smith paid 1,000 dollars.",
    ]


def test_later_short_clauses_are_merged_for_prosody() -> None:
    f = ClauseFeeder(TextConfig(clause_min_chars=24))
    assert f.feed("Okay. ") == ["Okay."]
    assert f.feed("Well, so, ") == []  # too short to stand alone after the first fragment
    assert f.feed("as I said, the plan works. ") == ["Well, so, as I said, the plan works."]


def test_long_first_fragment_without_punctuation_is_forced_after_max_words() -> None:
    f = ClauseFeeder(TextConfig(first_fragment_max_words=5))
    released = feed_words(f, "one two three four five six seven")
    assert ["one two three four five"] in released


def test_flush_releases_partial_clause_and_newline_cuts() -> None:
    f = ClauseFeeder(TextConfig())
    assert f.feed("First line\nsecond") == ["First line"]
    assert f.flush() == ["second"]
    assert f.flush() == []


def test_word_feeder_releases_complete_words_only() -> None:
    f = WordFeeder()
    assert f.feed("Hel") == []
    assert f.feed("lo wor") == ["Hello "]
    assert f.feed("ld, how") == ["world, "]
    assert f.pending == "how"
    assert f.flush() == ["how"]


def test_a_delta_with_no_word_boundary_is_released_in_bounded_clauses() -> None:
    cfg = TextConfig(max_clause_chars=300, max_word_chars=64)
    f = ClauseFeeder(cfg)
    released = f.feed("😀" * 8000)
    released += f.flush()
    assert all(0 < len(p) <= 300 for p in released)
    assert "".join(released).replace(" ", "") == "😀" * 8000


def test_the_feeder_cuts_hard_where_the_guard_lets_a_run_through() -> None:
    f = ClauseFeeder(TextConfig(max_clause_chars=100, max_word_chars=100_000))
    assert f.feed("x" * 250) == ["x" * 100, "x" * 100]
    assert f.pending == "x" * 50
    assert f.flush() == ["x" * 50]


def test_one_long_delta_without_punctuation_is_cut_at_word_boundaries() -> None:
    f = ClauseFeeder(TextConfig(max_clause_chars=300))
    text = "word " * 2000  # 10,000 characters in one delta
    released = f.feed(text) + f.flush()
    assert all(len(p) <= 300 for p in released) and len(released) >= 10_000 // 300
    assert " ".join(released) == text.strip()
    # A clause ended by punctuation is bounded too.
    f = ClauseFeeder(TextConfig(max_clause_chars=300))
    assert all(len(p) <= 300 for p in f.feed("Hi. " + "word " * 200 + "end."))


def test_word_feeder_always_finds_a_boundary() -> None:
    f = WordFeeder(TextConfig(max_word_chars=64))
    out = f.feed("7" * 1000)
    words = "".join(out).split()
    assert len(words) == 1000 // 64 and all(len(w) == 64 for w in words) and f.pending == "7" * (1000 % 64)
