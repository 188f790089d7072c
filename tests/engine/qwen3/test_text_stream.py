"""Streaming text input: word by word == whole text; a stream whose text stalls waits, never pads."""

from __future__ import annotations

import random

import numpy as np
import pytest

from voicewire.engine.model import StreamParams
from voicewire.engine.qwen3 import Qwen3TTSModel
from voicewire.engine.qwen3.testing import write_tokenizer_files
from voicewire.engine.qwen3.tokenizer import (
    MISTRAL_FIX_SPLIT,
    QWEN2_SPLIT,
    MemoTokenizer,
    Qwen2Tokenizer,
    StandInTokenizer,
    TextStream,
    split_regex_for,
)
from voicewire.engine.text_feeder import WordFeeder

from .conftest import run_stream

TEXT = "Hello world, this is a test of streaming text: McDonald's iPhone costs $3.50 -- right?  Yes!"
PARAMS = StreamParams(voice="ryan", language="english", greedy=True, forced_frames=45, seed=0)


def _llm_deltas(text: str, seed: int) -> list[str]:
    """Text cut at random character positions, as an LLM streams it."""
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(text)), 25))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


@pytest.fixture(scope="module")
def bpe(tmp_path_factory: pytest.TempPathFactory) -> Qwen2Tokenizer:
    d = tmp_path_factory.mktemp("tok")
    write_tokenizer_files(str(d))
    return Qwen2Tokenizer(str(d), "4.57.3")


@pytest.mark.parametrize("kind", ["bpe", "stand-in"])
@pytest.mark.parametrize("seed", range(5))
def test_text_stream_ids_equal_whole_text_ids(bpe: Qwen2Tokenizer, kind: str, seed: int) -> None:
    tok = bpe if kind == "bpe" else StandInTokenizer()
    feeder, stream = WordFeeder(), TextStream(tok)
    for delta in _llm_deltas(TEXT, seed):
        stream.push(feeder.feed(delta), final=False)
        # what is committed is always a prefix of the whole text's ids
        assert stream.ids == tok.encode(TEXT)[: len(stream.ids)]
    stream.push(feeder.flush(), final=True)
    assert stream.ids == tok.encode(TEXT)


def test_text_stream_without_trailing_spaces(bpe: Qwen2Tokenizer) -> None:
    stream = TextStream(bpe)
    words = TEXT.split(" ")
    pieces = [words[0]] + [" " + w for w in words[1:]]
    for p in pieces:
        stream.push([p], final=False)
    stream.push([], final=True)
    assert stream.ids == bpe.encode(TEXT)


def test_word_by_word_gives_the_codes_of_the_whole_text(tiny: Qwen3TTSModel) -> None:
    whole = run_stream(tiny, 0, [TEXT], PARAMS)
    feeder = WordFeeder()
    tiny.open_slot(1, PARAMS)
    frames = []
    for delta in _llm_deltas(TEXT, 7):
        pieces = feeder.feed(delta)
        if pieces:
            tiny.add_text(1, pieces, final=False)
        while tiny.ready(1):
            r = tiny.generate([1])[0]
            frames.append(r.frames)
    # it spoke while the text was still arriving, and then waited for the rest
    assert 0 < len(frames) < PARAMS.forced_frames
    tiny.add_text(1, feeder.flush(), final=True)
    while tiny.ready(1):
        r = tiny.generate([1])[0]
        frames.append(r.frames)
        if r.finished:
            break
    tiny.close_slot(1)
    codes = np.concatenate(frames)
    assert codes.shape == (PARAMS.forced_frames, 16)
    np.testing.assert_array_equal(codes, whole)


def test_a_stream_whose_text_stalls_waits_instead_of_padding(tiny: Qwen3TTSModel) -> None:
    whole = run_stream(tiny, 0, [TEXT], PARAMS)
    n_ids = len(tiny.tokenizer.encode("Hello world, this"))
    tiny.open_slot(2, PARAMS)
    assert not tiny.ready(2)  # no text yet: not even the prompt
    tiny.add_text(2, ["Hello ", "world, ", "this "], final=False)
    frames = []
    while tiny.ready(2):
        frames.append(tiny.generate([2])[0].frames)
    # frame k needs text tokens 0..k: it made as many frames as it has tokens, then stopped
    assert len(frames) == n_ids
    for _ in range(3):  # asked anyway (a scheduler bug): no frame, no padding, nothing consumed
        r = tiny.generate([2])[0]
        assert r.n_frames == 0 and r.frames is None and not r.finished
    assert not tiny.ready(2)
    tiny.add_text(2, [TEXT[len("Hello world, this ") :]], final=True)
    while tiny.ready(2):
        r = tiny.generate([2])[0]
        frames.append(r.frames)
        if r.finished:
            break
    tiny.close_slot(2)
    np.testing.assert_array_equal(np.concatenate(frames), whole)


def test_empty_text_finishes_without_frames(tiny: Qwen3TTSModel) -> None:
    tiny.open_slot(3, PARAMS)
    tiny.add_text(3, [], final=True)
    assert tiny.ready(3)
    r = tiny.generate([3])[0]
    assert r.finished and r.n_frames == 0 and not tiny.ready(3)
    tiny.close_slot(3)


def test_split_regex_follows_the_official_loader(bpe: Qwen2Tokenizer) -> None:
    # transformers 4.57.3 rewrites the split regex of > 100k-token vocabularies unless config.json
    # was saved by <= 4.57.2 or >= 5.0; the camel-case split shows which one is in force
    assert split_regex_for("4.57.3", 151_643) == MISTRAL_FIX_SPLIT
    assert split_regex_for("", 151_643) == MISTRAL_FIX_SPLIT
    assert split_regex_for("4.57.1", 151_643) == QWEN2_SPLIT
    assert split_regex_for("5.1.0", 151_643) == QWEN2_SPLIT
    assert split_regex_for("4.57.3", 5_000) == QWEN2_SPLIT
    assert [p for p, _ in bpe.split(" McDonald")] == [" Mc", "Donald"]
    assert [p for p, _ in StandInTokenizer().split(" McDonald")] == [" McDonald"]


def test_whole_text_mode_waits_for_the_end_then_prefills_it_all(tiny: Qwen3TTSModel) -> None:
    params = StreamParams(voice="ryan", greedy=True, forced_frames=12, seed=0, extra={"whole_text": True})
    whole = run_stream(tiny, 0, [TEXT], params)
    tiny.open_slot(1, params)
    tiny.add_text(1, ["Hello ", "world, "], final=False)
    assert not tiny.ready(1)  # unlike streamed text, nothing starts before the end of the text
    tiny.add_text(1, [TEXT[len("Hello world, ") :]], final=True)
    frames = []
    while tiny.ready(1):
        r = tiny.generate([1])[0]
        frames.append(r.frames)
        if r.finished:
            break
    tiny.close_slot(1)
    np.testing.assert_array_equal(np.concatenate(frames), whole)
    assert (whole != run_stream(tiny, 0, [TEXT], PARAMS)[:12]).any()  # a different prompt layout


def test_a_prompt_that_does_not_fit_fails_only_its_own_stream(device: str) -> None:
    from voicewire.engine.model import ModelError
    from voicewire.engine.qwen3 import load_qwen3

    model = load_qwen3(None, "tiny", device=device, seed=3, max_slots=2, max_batch_size=2, max_seq_len=32)
    model.open_slot(0, StreamParams(greedy=True, forced_frames=3, extra={"whole_text": True}))
    model.add_text(0, [" ".join(["word"] * 40)], final=True)
    model.open_slot(1, StreamParams(greedy=True, forced_frames=3))
    model.add_text(1, ["Short."], final=True)
    with pytest.raises(ModelError) as err:
        model.generate([1, 0])
    assert err.value.slot == 0
    model.close_slot(0)
    assert run_stream(model, 1, ["Short."], StreamParams(greedy=True, forced_frames=3)).shape == (3, 16)


@pytest.mark.parametrize("kind", ["bpe", "stand-in"])
def test_a_remembering_tokenizer_gives_what_the_tokenizer_gives(bpe: Qwen2Tokenizer, kind: str) -> None:
    """Short texts remembered, long ones not: the same splits, ids and streams either way."""
    tok = bpe if kind == "bpe" else StandInTokenizer()
    memo = MemoTokenizer(tok, entries=8, longest_chars=12)
    for text in [TEXT, " the", " the", "Hello world,", " world, this is", "", *TEXT.split(" ")] * 2:
        assert memo.split(text) == tok.split(text)
        assert memo.encode(text) == tok.encode(text)
    assert memo.role_ids == tok.role_ids and memo.instruct_ids("calm") == tok.instruct_ids("calm")
    feeder, stream = WordFeeder(), TextStream(memo)
    for delta in _llm_deltas(TEXT, 3):
        stream.push(feeder.feed(delta), final=False)
    stream.push(feeder.flush(), final=True)
    assert stream.ids == tok.encode(TEXT)
