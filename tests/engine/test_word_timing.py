"""The embedded voice's word timings: from its duration predictor, close to the audio, the same
audio as before (the phonemes hibari itself makes), and the word bookkeeping for token models."""

from __future__ import annotations

import numpy as np
import pytest

from tests.engine.word_accuracy import measure
from voicewire.engine import Engine
from voicewire.engine.models.hibari_graph import DURATION_TENSOR, with_durations
from voicewire.engine.models.hibari_voice import FIRST_CALL_PHONEMES, HibariModel, speakable
from voicewire.engine.models.hibari_words import match_words
from voicewire.engine.qwen3.tokenizer import StandInTokenizer
from voicewire.engine.word_timing import TokenWords, WordTiming, shifted


@pytest.fixture(scope="module")
def model() -> HibariModel:
    return HibariModel(workers=1)


def test_the_graph_gives_frames_per_phoneme_that_sum_to_its_output(model: HibariModel) -> None:
    tts = model._tts
    ids = tts.ids(tts.phonemize("Hello there, how are you today?")[0])
    feed = {"ids": np.asarray([ids], np.int64), "speed": np.asarray([1.0], np.float32)}
    lh, *_, durations = model._tts.sess.run(["lh", "theta", "ln", "lr", "phi", "f0", DURATION_TENSOR], feed)
    assert durations.shape == (len(ids),) and durations.min() >= 1
    assert lh.shape[2] == 2 * durations.sum()  # the network expands each unit to two 12.5 ms frames
    with open(tts.model_path, "rb") as f:
        original = f.read()
    edited = with_durations(original)
    assert with_durations(edited) == edited  # adding it twice changes nothing
    with pytest.raises(ValueError, match="duration"):
        with_durations(original.replace(DURATION_TENSOR.encode(), b"/Cast_99_output_0"))


@pytest.mark.parametrize(
    "text",
    [
        "Hello there, how are you today?",
        "On the 3rd of March 2024, 1,250 people paid $9.99 each at 7:30 pm.",
        "Dr. Smith isn't here — he's gone. Call 555-123-4567 at 3/4 past nine!",
    ],
)
def test_the_voice_speaks_the_phonemes_hibari_makes_and_times_every_word(model: HibariModel, text: str) -> None:
    clean = speakable(text)
    utterances = model._utterances(text, clean)
    assert [u.phonemes for u in utterances] == model._tts.phonemize(clean)  # the same audio as hibari's
    planned = [p for u in utterances for p in u.words]
    assert [p.word for p in planned] == clean.split()  # every word once, in order
    for u in utterances:
        n_ids = len(model._tts.ids(u.phonemes))
        assert all(0 < p.first_id <= p.end_id < n_ids for p in u.words)  # never the padding ids


def test_a_turns_first_call_is_short_and_every_word_still_timed_once(model: HibariModel) -> None:
    text = "The weather in the mountains will be cold this weekend so bring a warm jacket and good boots."
    clean = speakable(text)
    first, later = model._utterances(text, clean, first=True), model._utterances(text, clean)
    assert len(later) == 1 and len(first) == 2  # one call, or a short one and the rest
    assert len(first[0].phonemes) <= FIRST_CALL_PHONEMES < len(later[0].phonemes)
    assert " ".join(u.phonemes for u in first) == later[0].phonemes  # cut between words: the same phonemes
    assert [p.word for u in first for p in u.words] == clean.split()
    short = "Sure, I can help you with that booking today."
    assert len(model._utterances(short, speakable(short), first=True)) == 1  # a usual first clause is whole


def test_words_the_normalizer_rewrote_share_their_run() -> None:
    assert match_words(["at", "7:30", "pm."], ["at", "seven", "thirty", "P.M."]) == [
        (0, 1, 0.0, 1.0),
        (1, 3, 0.0, 1.0),
        (3, 4, 0.0, 1.0),
    ]
    # two clause words rewritten as one run share its time by their length
    assert match_words(["Hi", "3/4", "5/6"], ["Hi", "three", "quarters", "five", "sixths"])[1:] == [
        (1, 5, 0.0, 0.5),
        (1, 5, 0.5, 1.0),
    ]
    assert match_words(["well", "—", "yes"], ["well", "yes"])[1] == (1, 1, 0.0, 0.0)  # no sound of its own


def test_word_starts_are_within_30_ms_median_of_the_onsets_and_agree_with_whisper(engine: Engine) -> None:
    figures = measure(engine)
    assert figures["known_words"] == 30
    assert figures["known_median_ms"] <= 30 and figures["known_p90_ms"] <= 60, figures
    # Whisper tiny.en's own word starts are tens of ms off; agreement within 120 ms median is
    # the timings following the speech, a systematic error of a word would be hundreds.
    assert figures["whisper_matched_words"] >= 0.8 * figures["continuous_words"], figures
    assert figures["whisper_median_ms"] <= 120, figures


def test_token_words_follow_split_pieces_across_pushes() -> None:
    tok = StandInTokenizer()
    words = TokenWords(tok.split, tok.encode)
    for text in ("Hello, wor", "ld and", " the\nrest."):
        words.add(text, len(tok.encode(text)))
    assert words.words == ["Hello,", "world", "and", "the", "rest."]
    assert words.first_token[0] == 0 and words.n_tokens == sum(words.token_counts)
    assert words.first_token == [sum(words.token_counts[:i]) for i in range(len(words.words))]


def test_shifted_by_nothing_keeps_the_words_and_clamps_as_any_shift() -> None:
    words = [WordTiming("a", 0, 3), WordTiming("b", 3, 3)]
    assert shifted(words, 0) == words
    assert shifted([WordTiming("c", -2, 1), WordTiming("d", 4, 2)], 0) == [
        WordTiming("c", 0, 1),
        WordTiming("d", 4, 4),
    ]
    assert shifted(words, 5, 2) == [WordTiming("a", 5, 11), WordTiming("b", 11, 11)]
