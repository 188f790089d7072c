from engine.config import TextConfig
from engine.text_feeder import ClauseFeeder, WordFeeder


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
