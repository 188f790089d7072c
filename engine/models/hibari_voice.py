"""The embedded voice: ``hibari-tts`` (Apache-2.0, an 8 MB int8 ONNX model inside its wheel).

Stage 1 (``generate``): one clause per step -> G2P -> the ONNX network, which predicts a spectrum
per 12.5 ms frame (300 samples). Stage 2 (``decode``): hibari's numpy pulse+noise inverse STFT turns
those frames into 24 kHz PCM. The network is not autoregressive, so it needs whole phrases: the
model declares CLAUSE granularity and the engine's clause feeder releases a short first fragment.

Only the bundled default voice ("heart") is offered: every other hibari voice downloads on first
use, and a server must never reach out to a model hub at run time.

Bounded work per step. hibari's front end is written for prose; on other text its cost explodes
(phonemize: 4,000 emoji or 4,000 combining accents with no space take 8 s, 300 characters of
"a/a/a/..." 5 s, cubic in the run; the network: 117 ms for 400 phonemes, 13.6 s for 8,000; the
number reader fails on more than 36 digits). So each clause is made speakable for the English
voice first (``speakable``: no emoji or other symbols it cannot read, long digit runs in groups,
no run of more than ``MAX_RUN_CHARS`` without a space), at most ``MAX_PHONEMIZE_CHARS`` reach the
phonemizer at once, and one step runs the network on at most ``MAX_PHONEMES_PER_CALL`` phonemes.

Fair steps. The clause work of a step runs on a small pool, and ``generate`` waits for it at most
``STEP_WAIT_S``: a slot whose work is not done yet returns no frames and stays ready, so one
stream's slow clause holds one pool thread, not every other stream's step.

Word timings come from the network's own duration predictor (``hibari_graph.py`` exposes its
frames per phoneme id). The clause is phonemized token by token with hibari's G2P (the same
phoneme string its ``phonemize`` makes), so each word of the clause has its phonemes, and so its
ids, and so its frames: a word starts where its first phoneme's frames start and ends where its last
non-punctuation phoneme's end (a comma's pause is not part of the word). Where hibari's normalizer
rewrote words ("7:30" -> "seven thirty"), the clause words are matched to its tokens in order and a
run it rewrote as a whole shares the run's time by length. ``decode_timed`` moves the words with
the pauses it trims.
"""

from __future__ import annotations

import logging
import re
import time
import unicodedata
from collections import deque
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..level import ONSET_THRESHOLD_DBFS, apply_gain, first_audible_sample
from ..model import Decoded, DecodeWork, GenerateResult, Model, ModelInfo, StreamParams, TextGranularity
from ..text_guard import cut_to_length
from ..word_timing import WordTiming
from .hibari_graph import DURATION_TENSOR, with_durations
from .hibari_words import WordPlan, plan_calls, word_samples

log = logging.getLogger("voicewire.hibari")

SAMPLE_RATE_HZ = 24_000
FRAME_SAMPLES = 300  # hibari's STFT hop: 12.5 ms
GAIN_DB = 8.0  # raw output sits near -27 dBFS RMS, peaks near -9 dBFS
# hibari pads every utterance with 250-320 ms of near-silence before and 280-490 ms after. Between
# the clauses of one turn that would be a 0.6-0.8 s gap; keep a pause that fits the punctuation.
LEAD_MS = 20.0  # before a later clause (the first one's lead-in is the engine's to trim)
TAIL_MS = {"strong": 250.0, "weak": 120.0, "none": 30.0}  # after ". ! ?", after ", ; :", after a bare phrase
DEFAULT_VOICE = "heart"

# Front-end limits (see the module docstring for the costs they bound).
MAX_PHONEMIZE_CHARS = 300  # of clause text per phonemizer call: the clause feeder's own limit
MAX_RUN_CHARS = 24  # a longer run with no space is split: 24 chars of "a/a/..." phonemize in 5 ms
MAX_NUMBER_DIGITS = 15  # longer digit runs are read in groups of three (hibari names up to 36)
# Per network call: an English sentence of ~11 s, 290 ms on one core of a 2-core EPYC.
MAX_PHONEMES_PER_CALL = 200
# A turn's first call: a sentence's first ~3 s (~100 ms there). Its first audio waits for all of
# it, and so does every turn that comes in while the two workers run such calls.
FIRST_CALL_PHONEMES = 64
STEP_WAIT_S = 0.02  # generate() returns after this long even if a slot's clause work is still running
# Symbols outside letters, digits, punctuation and currency that hibari's normalizer reads aloud.
_READ_SYMBOLS = frozenset("°§¶±×÷™®©•→←")
_OUTPUTS = ("lh", "theta", "ln", "lr", "phi", "f0", DURATION_TENSOR)
_DIGIT_RUN = re.compile(r"\d+(?:,\d+)*")
_NON_SPACE_RUN = re.compile(rf"\S{{{MAX_RUN_CHARS + 1},}}")


@dataclass(frozen=True)
class _Utterance:
    """One network call's worth of a clause."""

    phonemes: str
    tail_ms: float  # pause kept after its audio
    text: str  # the clause text its audio speaks ("" for the later calls of a long clause)
    words: tuple[WordPlan, ...] = ()


@dataclass
class _Slot:
    # At most one clause job per slot runs at a time (on the pool), and the worker only appends
    # to ``clauses`` and then sets ``text_final``: the job reads them in the other order.
    clauses: deque[str] = field(default_factory=deque)
    utterances: deque[_Utterance] = field(default_factory=deque)  # phonemized, not yet synthesized
    text_final: bool = False
    finished: bool = False
    rng: np.random.Generator = field(default_factory=np.random.default_rng)
    speed: float = 1.0
    spoke_any: bool = False


@dataclass(frozen=True)
class _Frames:
    """Network output for one clause: five (601, F) spectral parts and F0 (F,)."""

    parts: tuple[np.ndarray, ...]
    first_clause: bool
    tail_ms: float
    words: tuple[WordTiming, ...] = ()  # in samples of the synthesized audio, before the pause trim


def speakable(text: str) -> str:
    """``text`` as the English voice can read it at a bounded cost: only characters it speaks
    (letters, digits, punctuation, currency, symbols its normalizer names; no emoji or combining
    marks left over after NFC), digit runs over ``MAX_NUMBER_DIGITS`` in groups of three, and no
    run of more than ``MAX_RUN_CHARS`` without a space. Ordinary prose comes back unchanged."""
    text = "".join(_keep(ch) for ch in unicodedata.normalize("NFC", text))
    text = _DIGIT_RUN.sub(_digit_groups, text)
    return _NON_SPACE_RUN.sub(_split_run, text).strip()


def _keep(ch: str) -> str:
    if ch.isascii():
        return ch if ch.isprintable() or ch.isspace() else ""
    category = unicodedata.category(ch)
    if category[0] in "LNPZ" or category == "Sc" or ch in _READ_SYMBOLS:
        return ch
    return " " if ch.isspace() else ""


def _digit_groups(m: re.Match[str]) -> str:
    digits = m.group().replace(",", "")
    if len(digits) <= MAX_NUMBER_DIGITS:
        return m.group()
    head = len(digits) % 3 or 3  # "1234567..." -> "1 234 567 ...", as thousands are grouped
    return " ".join([digits[:head], *(digits[i : i + 3] for i in range(head, len(digits), 3))])


def _split_run(m: re.Match[str]) -> str:
    """A long run in pieces of at most MAX_RUN_CHARS, cut after its last non-alphanumeric
    character within the limit ("example.com/ some/path") or hard where there is none."""
    run, pieces = m.group(), []
    while len(run) > MAX_RUN_CHARS:
        window = run[:MAX_RUN_CHARS]
        cut = max((i + 1 for i, ch in enumerate(window[:-1]) if not ch.isalnum()), default=MAX_RUN_CHARS)
        pieces.append(run[:cut])
        run = run[cut:]
    return " ".join([*pieces, run])


class HibariModel(Model):
    def __init__(self, threads: int = 1, workers: int = 2, max_slots: int = 1024) -> None:
        import onnxruntime as ort
        from hibari import Hibari

        self._tts = Hibari(threads=threads)  # default voice: inside the wheel, no download
        # The same network with its duration predictor's frame counts as one more output, in
        # place of hibari's own session (the same options: see hibari.tts.Hibari).
        options = ort.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = threads
        options.log_severity_level = 3
        with open(self._tts.model_path, "rb") as f:
            graph = with_durations(f.read())
        self._tts.sess = ort.InferenceSession(graph, options, providers=["CPUExecutionProvider"])
        self._slots: dict[int, _Slot] = {}
        # The network takes one utterance per call, so a "batch" is run as parallel calls: onnxruntime
        # releases the GIL, and two single-threaded runs at once beat one two-threaded run (the
        # engine's worker and the event loop share the machine's cores with them). Decoding has
        # its own pool so that it never queues behind a slow clause.
        self._workers = workers
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="hibari") if workers > 1 else None
        self._decode_pool = (
            ThreadPoolExecutor(workers, thread_name_prefix="hibari-decode") if workers > 1 else None
        )
        self._inflight: dict[int, Future[GenerateResult]] = {}  # slot -> its clause job on the pool
        # Jobs of closed slots that had started: a slot number is not reused until its job is done.
        self._orphans: dict[int, Future[GenerateResult]] = {}
        self.info = ModelInfo(
            name="hibari",
            sample_rate_hz=SAMPLE_RATE_HZ,
            frame_samples=FRAME_SAMPLES,
            text_granularity=TextGranularity.CLAUSE,
            max_batch_size=workers,  # one clause per slot per step keeps ticks short (10-40 ms)
            max_slots=max_slots,
            voices=(DEFAULT_VOICE,),
        )

    def warmup(self) -> None:
        from hibari import dsp

        u = self._utterances("Warm up.", "Warm up.")[0]
        feed = {"ids": np.asarray([self._tts.ids(u.phonemes)], np.int64), "speed": np.ones(1, np.float32)}
        out = self._tts.sess.run(list(_OUTPUTS), feed)
        dsp.synth(*(np.asarray(o)[0] for o in out[:-1]), np.random.default_rng(0))

    def open_slot(self, slot: int, params: StreamParams) -> None:
        orphan = self._orphans.pop(slot, None)
        if orphan is not None:
            wait([orphan])  # at most one clause job (bounded above); only when a slot is reused at once
        self._slots[slot] = _Slot(rng=np.random.default_rng(params.seed), speed=params.speed)

    def add_text(self, slot: int, pieces: Sequence[str], final: bool) -> None:
        s = self._slots[slot]
        s.clauses.extend(q for p in pieces for q in cut_to_length(p, MAX_PHONEMIZE_CHARS))
        s.text_final = s.text_final or final

    def ready(self, slot: int) -> bool:
        s = self._slots[slot]
        return slot in self._inflight or bool(s.clauses or s.utterances) or (s.text_final and not s.finished)

    def generate(self, slots: Sequence[int]) -> list[GenerateResult]:
        if self._pool is None:
            return [self._timed(slot) for slot in slots]
        for slot in slots:  # most urgent first (the scheduler's order)
            # No more jobs than workers: a job queued behind busy workers would keep its place in
            # the queue while a more urgent slot (another client's new turn) is planned on the
            # next step; not queued, that slot takes the first worker to come free.
            if slot not in self._inflight and self._running() < self._workers:
                self._inflight[slot] = self._pool.submit(self._timed, slot)
        jobs = [self._inflight[slot] for slot in slots if slot in self._inflight]
        if jobs:
            wait(jobs, timeout=STEP_WAIT_S)
        else:  # every worker busy with other slots' jobs: until one is free
            running = [j for j in self._inflight.values() if not j.done()]
            wait(running, timeout=STEP_WAIT_S, return_when=FIRST_COMPLETED)
        results = []
        for slot in slots:
            job = self._inflight.get(slot)
            if job is not None and job.done():
                del self._inflight[slot]
                results.append(job.result())
            else:  # still working, or waiting for a worker: nothing this step, asked again on the next
                results.append(GenerateResult(slot, None, 0, finished=False))
        return results

    def _running(self) -> int:
        """Jobs on a worker now (a finished job waits to be collected without holding one)."""
        return sum(not j.done() for j in (*self._inflight.values(), *self._orphans.values()))

    def _timed(self, slot: int) -> GenerateResult:
        t0 = time.perf_counter()
        result = self._generate_isolated(slot)
        result.compute_s = time.perf_counter() - t0
        return result

    def _generate_isolated(self, slot: int) -> GenerateResult:
        try:
            return self._generate_one(slot)
        except Exception as err:  # one bad clause must not fail the other slot of the batch
            return GenerateResult(slot, None, 0, finished=True, error=f"{type(err).__name__}: {err}")

    def _generate_one(self, slot: int) -> GenerateResult:
        """One network call for ``slot``: the next utterance of its current clause, phonemizing the
        next clause first when none is left (clauses with nothing speakable cost no phonemizer call)."""
        s = self._slots[slot]
        while not s.utterances and s.clauses:
            clause = s.clauses.popleft()
            text = speakable(clause)
            if text:
                s.utterances.extend(self._utterances(clause, text, first=not s.spoke_any))
                break  # at most one phonemizer call per job, even when it yields nothing
        if not s.utterances:
            s.finished = s.text_final and not s.clauses
            return GenerateResult(slot, None, 0, finished=s.finished)
        u = s.utterances.popleft()
        ids = self._tts.ids(u.phonemes)
        frames: list[_Frames] = []
        if len(ids) >= 3:
            out = self._tts.sess.run(
                list(_OUTPUTS),
                {"ids": np.asarray([ids], np.int64), "speed": np.asarray([s.speed], np.float32)},
            )
            parts = tuple(np.asarray(o)[0] for o in out[:-1])
            words = word_samples(u.words, np.asarray(out[-1]).reshape(-1), parts[0].shape[1] * FRAME_SAMPLES, SAMPLE_RATE_HZ)
            frames.append(_Frames(parts, not s.spoke_any, u.tail_ms, words))
            s.spoke_any = True
        s.finished = s.text_final and not s.clauses and not s.utterances
        if not frames:
            return GenerateResult(slot, None, 0, finished=s.finished)
        n_frames = frames[0].parts[0].shape[1]
        return GenerateResult(slot, frames, n_frames, finished=s.finished, text_spoken=u.text)

    def _utterances(self, clause: str, text: str, first: bool = False) -> list[_Utterance]:
        """``clause`` (made ``speakable`` as ``text``) as network calls of bounded length, each
        with the plan of its words' times."""
        parts: list[tuple[str, list[WordPlan]]] = []
        try:
            for sentence in self._tts.split_sentences(text):
                phonemes, spans = self._phonemize_words(sentence)
                if phonemes:
                    first_max = FIRST_CALL_PHONEMES if first and not parts else None
                    parts += plan_calls(
                        phonemes, spans, sentence.split(), self._tts.vocab, MAX_PHONEMES_PER_CALL, first_max
                    )
        except Exception:  # the word plan must never cost the audio: hibari's own path, untimed
            log.warning("word timing failed for a clause of %d characters; speaking it untimed", len(text),
                        exc_info=True)  # fmt: skip
            parts = [
                (part, [])
                for sentence in self._tts.phonemize(text)
                for part in cut_to_length(sentence, MAX_PHONEMES_PER_CALL)
            ]
        last = len(parts) - 1
        return [
            _Utterance(
                part,
                TAIL_MS[_ending(clause if i == last else part)],  # a cut mid-sentence keeps a short pause
                clause if i == 0 else "",
                tuple(plans),
            )
            for i, (part, plans) in enumerate(parts)
        ]

    def _phonemize_words(self, sentence: str) -> tuple[str, list[tuple[str, int, int]]]:
        """hibari's phoneme string for one sentence (what ``G2P.__call__`` returns), and its G2P
        words (tokens up to one followed by whitespace): (text, start, end) in that string."""
        from hibari.g2p.normalize import normalize

        g2p: Any = self._tts.g2p
        phonemes, words, word = "", [], None
        for tk in g2p.phonemize_tokens(g2p.tokenize(normalize(sentence))):
            start = len(phonemes)
            phonemes += g2p.unk if tk.phonemes is None else tk.phonemes
            word = (tk.text, start, len(phonemes)) if word is None else (word[0] + tk.text, word[1], len(phonemes))
            if tk.whitespace:
                phonemes += " "
                words.append(word)
                word = None
        if word is not None:
            words.append(word)
        lead = len(phonemes) - len(phonemes.lstrip())
        return phonemes.strip(), [(w, max(0, a - lead), max(0, b - lead)) for w, a, b in words]

    def decode(self, work: Sequence[DecodeWork]) -> list[np.ndarray]:
        return [d.pcm for d in self.decode_timed(work)]

    def decode_timed(self, work: Sequence[DecodeWork]) -> list[Decoded]:
        if self._decode_pool is None or len(work) == 1:
            return [self._decode_one(item) for item in work]
        return list(self._decode_pool.map(self._decode_one, work))

    def _decode_one(self, item: DecodeWork) -> Decoded:
        from hibari import dsp

        rng = self._slots[item.slot].rng
        pieces: list[np.ndarray] = []
        words: list[WordTiming] = []
        at = 0  # samples of this chunk before the piece
        for payload in item.frames:
            for fr in payload:  # type: ignore[attr-defined]
                pcm, cut = _trim_pauses(
                    dsp.synth(*fr.parts, rng), None if fr.first_clause else LEAD_MS, fr.tail_ms
                )
                for w in fr.words:  # the trims only take silence; a word cut into keeps the rest
                    start = min(max(0, w.start - cut), pcm.size)
                    words.append(WordTiming(w.word, at + start, at + min(max(start, w.end - cut), pcm.size)))
                pieces.append(apply_gain(pcm, GAIN_DB))
                at += pcm.size
        return Decoded(np.concatenate(pieces) if pieces else np.zeros(0, np.float32), tuple(words))

    def close_slot(self, slot: int) -> None:
        job = self._inflight.pop(slot, None)
        if job is not None and not job.cancel():
            self._orphans[slot] = job  # running: it finishes on its own, its result unread
        self._slots.pop(slot, None)

    @property
    def open_slots(self) -> int:
        return len(self._slots)


def _ending(clause: str) -> str:
    last = clause.rstrip("\"')]”’ ")[-1:]
    return "strong" if last in ".!?…" else "weak" if last in ",;:—" else "none"


def _trim_pauses(pcm: np.ndarray, lead_ms: float | None, tail_ms: float) -> tuple[np.ndarray, int]:
    """Keep ``lead_ms`` before the first audible window (None: keep it all) and ``tail_ms`` after
    the last; also returns how many samples were cut from the start."""
    onset = first_audible_sample(pcm, SAMPLE_RATE_HZ, ONSET_THRESHOLD_DBFS)
    if onset is None:
        return pcm, 0
    end = pcm.size - (first_audible_sample(pcm[::-1], SAMPLE_RATE_HZ, ONSET_THRESHOLD_DBFS) or 0)
    start = 0 if lead_ms is None else max(0, onset - int(SAMPLE_RATE_HZ * lead_ms / 1000))
    return pcm[start : min(pcm.size, end + int(SAMPLE_RATE_HZ * tail_ms / 1000))], start


