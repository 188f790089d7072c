"""The embedded voice: ``hibari-tts`` (Apache-2.0, an 8 MB int8 ONNX model inside its wheel).

Stage 1 (``generate``): one clause per step -> G2P -> the ONNX network, which predicts a spectrum
per 12.5 ms frame (300 samples). Stage 2 (``decode``): hibari's numpy pulse+noise inverse STFT turns
those frames into 24 kHz PCM. The network is not autoregressive, so it needs whole phrases: the
model declares CLAUSE granularity and the engine's clause feeder releases a short first fragment.

Only the bundled default voice ("heart") is offered: every other hibari voice downloads on first
use, and a server must never reach out to a model hub at run time.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from ..level import apply_gain, first_audible_sample
from ..model import DecodeWork, GenerateResult, Model, ModelInfo, StreamParams, TextGranularity

SAMPLE_RATE_HZ = 24_000
FRAME_SAMPLES = 300  # hibari's STFT hop: 12.5 ms
GAIN_DB = 8.0  # raw output sits near -27 dBFS RMS, peaks near -9 dBFS
# hibari pads every utterance with 250-320 ms of near-silence before and 280-490 ms after. Between
# the clauses of one turn that would be a 0.6-0.8 s gap; keep a pause that fits the punctuation.
LEAD_MS = 20.0  # before a later clause (the first one's lead-in is the engine's to trim)
TAIL_MS = {"strong": 250.0, "weak": 120.0, "none": 30.0}  # after ". ! ?", after ", ; :", after a bare phrase
ONSET_DBFS = -45.0
DEFAULT_VOICE = "heart"


@dataclass
class _Slot:
    clauses: deque[str] = field(default_factory=deque)
    text_final: bool = False
    finished: bool = False
    rng: np.random.Generator = field(default_factory=np.random.default_rng)
    speed: float = 1.0
    clauses_done: int = 0


@dataclass(frozen=True)
class _Frames:
    """Network output for one clause: five (601, F) spectral parts and F0 (F,)."""

    parts: tuple[np.ndarray, ...]
    first_clause: bool
    tail_ms: float


class HibariModel(Model):
    def __init__(self, threads: int = 1, workers: int = 2, max_slots: int = 1024) -> None:
        from hibari import Hibari

        self._tts = Hibari(threads=threads)  # default voice: inside the wheel, no download
        self._slots: dict[int, _Slot] = {}
        # The network takes one utterance per call, so a "batch" is run as parallel calls: onnxruntime
        # releases the GIL, and two single-threaded runs at once beat one two-threaded run (the
        # engine's worker and the event loop share the machine's cores with them).
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="hibari") if workers > 1 else None
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
        self._tts("Warm up.", seed=0)

    def open_slot(self, slot: int, params: StreamParams) -> None:
        self._slots[slot] = _Slot(rng=np.random.default_rng(params.seed), speed=params.speed)

    def add_text(self, slot: int, pieces: Sequence[str], final: bool) -> None:
        s = self._slots[slot]
        s.clauses.extend(p for p in pieces if p.strip())
        s.text_final = s.text_final or final

    def ready(self, slot: int) -> bool:
        s = self._slots[slot]
        return bool(s.clauses) or (s.text_final and not s.finished)

    def generate(self, slots: Sequence[int]) -> list[GenerateResult]:
        if self._pool is None or len(slots) == 1:
            return [self._generate_isolated(slot) for slot in slots]
        return list(self._pool.map(self._generate_isolated, slots))

    def _generate_isolated(self, slot: int) -> GenerateResult:
        try:
            return self._generate_one(slot)
        except Exception as err:  # one bad clause must not fail the other slot of the batch
            return GenerateResult(slot, None, 0, finished=True, error=f"{type(err).__name__}: {err}")

    def _generate_one(self, slot: int) -> GenerateResult:
        s = self._slots[slot]
        if not s.clauses:
            s.finished = s.text_final
            return GenerateResult(slot, None, 0, finished=s.finished)
        clause = s.clauses.popleft()
        outputs: list[tuple[np.ndarray, ...]] = []
        for phonemes in self._tts.phonemize(clause):
            ids = self._tts.ids(phonemes)
            if len(ids) < 3:
                continue
            out = self._tts.sess.run(
                None,
                {"ids": np.asarray([ids], np.int64), "speed": np.asarray([s.speed], np.float32)},
            )
            outputs.append(tuple(np.asarray(o)[0] for o in out))
        s.finished = s.text_final and not s.clauses
        first = s.clauses_done == 0
        s.clauses_done += 1
        if not outputs:
            return GenerateResult(slot, None, 0, finished=s.finished)
        tail = TAIL_MS[_ending(clause)]
        frames = [_Frames(parts, first and i == 0, tail) for i, parts in enumerate(outputs)]
        n_frames = sum(f.parts[0].shape[1] for f in frames)
        return GenerateResult(slot, frames, n_frames, finished=s.finished, text_spoken=clause)

    def decode(self, work: Sequence[DecodeWork]) -> list[np.ndarray]:
        if self._pool is None or len(work) == 1:
            return [self._decode_one(item) for item in work]
        return list(self._pool.map(self._decode_one, work))

    def _decode_one(self, item: DecodeWork) -> np.ndarray:
        from hibari import dsp

        rng = self._slots[item.slot].rng
        pieces: list[np.ndarray] = []
        for payload in item.frames:
            for fr in payload:  # type: ignore[attr-defined]
                pcm = _trim_pauses(dsp.synth(*fr.parts, rng), None if fr.first_clause else LEAD_MS, fr.tail_ms)
                pieces.append(apply_gain(pcm, GAIN_DB))
        return np.concatenate(pieces) if pieces else np.zeros(0, np.float32)

    def close_slot(self, slot: int) -> None:
        self._slots.pop(slot, None)

    @property
    def open_slots(self) -> int:
        return len(self._slots)


def _ending(clause: str) -> str:
    last = clause.rstrip("\"')]”’ ")[-1:]
    return "strong" if last in ".!?…" else "weak" if last in ",;:—" else "none"


def _trim_pauses(pcm: np.ndarray, lead_ms: float | None, tail_ms: float) -> np.ndarray:
    """Keep ``lead_ms`` before the first audible window (None: keep it all) and ``tail_ms`` after the last."""
    onset = first_audible_sample(pcm, SAMPLE_RATE_HZ, ONSET_DBFS)
    if onset is None:
        return pcm
    end = pcm.size - (first_audible_sample(pcm[::-1], SAMPLE_RATE_HZ, ONSET_DBFS) or 0)
    start = 0 if lead_ms is None else max(0, onset - int(SAMPLE_RATE_HZ * lead_ms / 1000))
    return pcm[start : min(pcm.size, end + int(SAMPLE_RATE_HZ * tail_ms / 1000))]
