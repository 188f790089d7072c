"""The contract between the engine and a TTS model.

A model turns text into audio in two stages, driven by the engine's worker thread:

1. ``generate``: one step of stage 1 for a batch of slots. Each ready slot yields zero or more
   *frames* (codec frames for Qwen3-TTS: 80 ms, 16 codes; spectral frames for the embedded voice).
   The payload is the model's own business; the engine only counts frames and hands them back.
2. ``decode``: stage 2, frames -> 24 kHz float32 PCM, for a batch of chunks due this tick.

Text reaches a slot through ``add_text`` at the granularity the model declares (``ModelInfo``):
whole clauses for a model that needs phrases, or word pieces for a model that reads streaming text
token by token. A slot is *ready* when a generate step would make progress; a slot waiting for text
is not ready and costs nothing.

Slots are small integers owned by the engine (``0 <= slot < max_slots``); a model keeps per-slot
state (KV cache, decoder state, text queue) indexed by slot and frees it in ``close_slot``.
Every method runs on the engine's worker thread only: no locking is needed inside a model.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import numpy as np

from .cloned_voice import ClonedVoice, CloningNotSupported
from .word_timing import WordTiming, shifted

_T = TypeVar("_T")


class Queued(Generic[_T]):
    """Work a model has begun: calling it waits for its result; ``done`` says, without waiting,
    whether that call would return at once (always, for work finished before it was handed back)."""

    def __init__(self, wait: Callable[[], _T], done: Callable[[], bool] | None = None) -> None:
        self._wait, self._done = wait, done

    @classmethod
    def finished(cls, result: _T) -> Queued[_T]:
        return cls(lambda: result)

    def __call__(self) -> _T:
        return self._wait()

    def done(self) -> bool:
        return self._done is None or self._done()


class TextGranularity(enum.Enum):
    """How a model wants its text."""

    CLAUSE = "clause"  # whole clauses/sentences (non-autoregressive voices)
    WORD = "word"  # complete words as they arrive; the model tokenizes (streaming-text LMs)


@dataclass(frozen=True)
class ModelInfo:
    name: str
    sample_rate_hz: int  # output PCM rate
    frame_samples: int  # PCM samples per stage-1 frame (Qwen3-TTS-12Hz: 1920; hibari: 300)
    text_granularity: TextGranularity
    max_batch_size: int  # most slots one generate() call takes
    max_slots: int  # most streams the model holds at once
    voices: tuple[str, ...]  # accepted voice names; the first is the default
    random_weights: bool = False  # untrained weights (benchmarks, tests): the audio is noise
    # (seconds of playback slack, frames): the longer chunks the model decodes efficiently, for
    # streams that far ahead of their listener (ChunkSchedule.slack_frames, when a config gives none)
    slack_chunk_frames: tuple[tuple[float, int], ...] = ()
    # what derives this model's cloned voices ("" = it cannot clone); a ClonedVoice fits only the
    # encoder that made it (cloned_voice.py)
    voice_encoder: str = ""
    # streams the engine runs through itself before it says ready (warm_load.py): a GPU model's
    # batch, so every bucket and path serving takes has run; 0 = none (a CPU voice warms in warmup)
    warm_load_streams: int = 0


@dataclass(frozen=True)
class KVRoom:
    """A model's KV memory in blocks, for admission (``Model.kv_room``): a stream holds blocks as it
    speaks, so what is free now decides whether one more can get going."""

    free_blocks: int  # blocks no stream holds now
    total_blocks: int  # blocks streams can hold at all
    block_positions: int  # positions (frames, prompt tokens) one block holds
    new_stream_blocks: int  # blocks a new stream takes to get going: its prompt and ~4 s of frames


@dataclass(frozen=True)
class StreamParams:
    """Per-stream request options, validated by the engine before a slot is opened."""

    voice: str = ""  # "" = the model's default voice
    speed: float = 1.0  # 0.5 .. 2.0
    seed: int | None = None  # fixes sampling noise; None = random
    greedy: bool = False  # argmax sampling (models that sample)
    forced_frames: int | None = None  # random-weight models: frames per utterance instead of a stop token
    first_chunk_frames: int | None = None  # override of the engine's chunk schedule for the first chunk
    language: str = ""  # models with languages; "" = auto/default
    extra: dict[str, object] = field(default_factory=dict)  # model-specific options
    # Whose stream this is (the gateway's client): when more streams are ready than a batch
    # holds, the scheduler shares batches out across tenants. "" = one anonymous tenant.
    tenant: str = ""

    def check(self, info: ModelInfo) -> None:
        """Raises ValueError for options this model cannot take (checked before a slot opens)."""
        if self.voice and self.voice not in info.voices:
            raise ValueError(f"unknown voice {self.voice!r}; this model has {', '.join(info.voices)}")
        if not 0.5 <= self.speed <= 2.0:
            raise ValueError(f"speed must be within 0.5..2.0, got {self.speed}")
        if self.first_chunk_frames is not None and not 1 <= self.first_chunk_frames <= 64:
            raise ValueError("first_chunk_frames must be within 1..64")
        if self.forced_frames is not None and self.forced_frames < 1:
            raise ValueError("forced_frames must be >= 1")


@dataclass
class GenerateResult:
    """What one generate step produced for one slot."""

    slot: int
    frames: object | None  # model payload for ``n_frames`` frames, or None
    n_frames: int
    finished: bool  # True when the slot will produce no more frames (stop token / text exhausted)
    text_spoken: str = ""  # the text these frames speak, when the model knows it (for barge-in truncation)
    error: str | None = None  # this slot failed (the others in the batch did not): the engine ends its stream
    compute_s: float = 0.0  # model time this step spent on this slot (0 where a model does not measure it)
    # with ``finished``: why the slot stopped, where it was not the model's own end (stop token, text
    # spoken, forced length): "length" = a length cap or a runaway guard cut it (engine/qwen3/guards.py)
    stop_reason: str | None = None
    # words whose audio starts in these frames, in frames from the first of them (word_timing.py);
    # a model that knows its words only after stage 2 reports them from decode_timed instead
    words: tuple[WordTiming, ...] = ()


@dataclass(frozen=True)
class DecodeWork:
    """A chunk due for stage 2: a slot's frames since its last chunk (the scheduler makes these)."""

    slot: int
    frames: list[object]  # payloads from generate(), oldest first
    n_frames: int
    final: bool  # the last chunk of this slot: flush any held-back samples
    text: str = ""  # text these frames speak, where the model knows it (for the emitted chunk)
    stream_id: int = 0  # the engine's stream id (bookkeeping for the engine; a model ignores it)
    slack_s: float = 0.0  # the stream's playback slack when the chunk came due (the engine's, too)
    words: tuple[WordTiming, ...] = ()  # GenerateResult.words of these frames, in frames from the first


@dataclass(frozen=True)
class Decoded:
    """Stage 2's output for one DecodeWork: its PCM and the words that start in it."""

    pcm: np.ndarray  # float32 mono at ``info.sample_rate_hz``
    words: tuple[WordTiming, ...] = ()  # in samples of ``pcm`` (an end may lie past it)


class Model(ABC):
    """A TTS model served by the engine. See the module docstring for the life of a slot."""

    info: ModelInfo
    # decode_start returns before its work is done (stage 2 on a device queue of its own): the engine
    # then decodes one step's chunks while the next steps generate (EngineConfig.overlap_decode)
    decode_overlaps: bool = False
    # frame steps that may be begun before the oldest one's results are taken: 2 lets the engine
    # queue the next step behind the running one, so the device never waits for the host's record
    # and plan between them (EngineConfig.queue_ahead). Such a model's ``ready`` counts the frames
    # of its begun steps, and a slot that a begun step ended (a stop token) makes nothing in a later one.
    steps_in_flight: int = 1
    # decode_start(work, urgent=True) runs on a lane of its own, ahead of the codec work begun
    # before it: the engine then begins the chunks of streams about to run dry apart from the rest
    # (EngineConfig.urgent_slack_s) and hands out their audio as soon as it is done, which it asks
    # of the ``done`` of that work and of the running frame step (so both must turn true by themselves)
    urgent_decode: bool = False

    @abstractmethod
    def open_slot(self, slot: int, params: StreamParams) -> None:
        """Allocate per-stream state for a new utterance."""

    @abstractmethod
    def add_text(self, slot: int, pieces: Sequence[str], final: bool) -> None:
        """Append text pieces (at ``info.text_granularity``); ``final`` = no more text will come."""

    @abstractmethod
    def ready(self, slot: int) -> bool:
        """True when ``generate`` would make progress for this slot now."""

    @abstractmethod
    def generate(self, slots: Sequence[int]) -> list[GenerateResult]:
        """One stage-1 step for these ready slots (len <= max_batch_size); one result per slot, same order."""

    def generate_start(self, slots: Sequence[int]) -> Queued[list[GenerateResult]]:
        """``generate``, begun: calling the result gives its results. By default all of the work
        is done here; a model whose step runs on a device queue returns once the step is queued.
        Until the results are taken, the engine closes none of these slots (a stream that ends
        meanwhile frees its slot after them) and begins at most ``steps_in_flight - 1`` other
        steps, whose results it takes in the order the steps began; it may open other slots, add
        text and run stage 2."""
        return Queued.finished(self.generate(slots))

    @abstractmethod
    def decode(self, work: Sequence[DecodeWork]) -> list[np.ndarray]:
        """Stage 2: frames -> float32 mono PCM at ``info.sample_rate_hz``, one array per DecodeWork, same order."""

    def decode_timed(self, work: Sequence[DecodeWork]) -> list[Decoded]:
        """``decode`` with each chunk's words in samples. By default the frame-unit words of each
        DecodeWork, scaled by ``info.frame_samples`` (exact for a model whose decoder puts out
        exactly that many samples per frame); a model whose stage 2 changes the timing (trims
        pauses) overrides it."""
        return with_frame_words(work, self.decode(work), self.info.frame_samples)

    def device_wait_s(self) -> float:
        """Seconds the worker has spent blocked on this model's device queues so far (a model whose
        work runs on a device of its own counts its waits; 0 where all of it is host work). The
        engine's step time less this is the host's time per step."""
        return 0.0

    def decode_start(self, work: Sequence[DecodeWork], urgent: bool = False) -> Queued[list[Decoded]]:
        """``decode_timed``, begun. By default all of the work is done here; a model whose stage 2
        runs on a device queue of its own returns once it is queued, and the engine runs the next
        frame steps while it runs, taking its result once it is done. ``urgent``: see
        ``urgent_decode`` (a model without that lane ignores it)."""
        return Queued.finished(self.decode_timed(work))

    @abstractmethod
    def close_slot(self, slot: int) -> None:
        """Free everything the slot holds (finished or cancelled)."""

    def kv_room(self) -> KVRoom | None:
        """The KV block pool now (KVRoom); None for a model without one (all its memory is
        reserved per slot, so a free slot is all a new stream needs). A stream that finds no block
        for its next position ends with an error (GenerateResult.error), the others go on."""
        return None

    def warmup(self) -> None:  # noqa: B027 - optional hook
        """Run once at start so the first request pays no lazy-init cost."""

    def clone_voice(self, pcm: np.ndarray, sample_rate_hz: int, ref_text: str) -> ClonedVoice:
        """A reference clip (float32 mono at ``sample_rate_hz``) and its transcript ("" = none) ->
        a voice for ``StreamParams.extra[CLONED_VOICE_KEY]``; ValueError for audio it cannot use.

        The one method that does not run on the worker thread: the engine calls it on a thread
        of its own while the worker keeps stepping (a clone costs 100-300 ms on real encoders,
        which would stall every stream), so it must not touch slot state."""
        raise CloningNotSupported(f"{self.info.name} cannot clone voices")


def with_frame_words(
    work: Sequence[DecodeWork], pcms: Sequence[np.ndarray], frame_samples: int
) -> list[Decoded]:
    """Each chunk's PCM with its frame-unit words in samples (a decoder of exactly ``frame_samples``
    samples per frame)."""
    return [
        Decoded(pcm, tuple(shifted(w.words, 0, frame_samples))) for w, pcm in zip(work, pcms, strict=True)
    ]


class ModelError(Exception):
    """A model failed on one slot; the engine ends that stream with an error and keeps the others."""

    def __init__(self, slot: int, message: str) -> None:
        super().__init__(message)
        self.slot = slot
