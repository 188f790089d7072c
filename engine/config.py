"""Engine configuration: frozen dataclasses, validated once at construction."""

from __future__ import annotations

from dataclasses import dataclass, field

from .level import ONSET_THRESHOLD_DBFS


@dataclass(frozen=True)
class ChunkSchedule:
    """When generated frames are handed to the decoder (and audio emitted), in frames.

    The first chunk is small for time-to-first-packet; later chunks ramp up to ``steady_frames``
    so the decoder runs fewer, larger calls. Separate from the decode window: a stateful decoder
    needs no re-decoded context, whatever the chunk size.
    """

    first_frames: int = 1
    ramp_frames: tuple[int, ...] = (2, 4, 8)
    steady_frames: int = 12
    # (seconds of playback slack, frames): a later chunk of a stream at least that far ahead of its
    # listener is this long, so streams with time to spare make fewer, fuller decoder calls. Only
    # sizes a model decodes efficiently belong here; None: the model's (ModelInfo.slack_chunk_frames).
    slack_frames: tuple[tuple[float, int], ...] | None = None

    def __post_init__(self) -> None:
        sizes = (self.first_frames, *self.ramp_frames, self.steady_frames, *(f for _, f in self.slack_frames or ()))
        if any(s < 1 for s in sizes):
            raise ValueError(f"chunk sizes must be >= 1 frame, got {sizes}")

    def frames_for(self, chunk_index: int, first_override: int | None = None, slack_s: float = 0.0) -> int:
        """Frames that make chunk number ``chunk_index`` (0-based) due, for a stream ``slack_s``
        seconds of audio ahead of a listener who started at its first chunk."""
        frames = self.least_frames(chunk_index, first_override)
        if chunk_index == 0:
            return frames
        for min_slack_s, n in self.slack_frames or ():
            if slack_s >= min_slack_s:
                frames = max(frames, n)
        return frames

    def least_frames(self, chunk_index: int, first_override: int | None = None) -> int:
        """``frames_for`` before the slack sizes: the fewest frames that make the chunk due, whatever
        the stream's slack (slack only ever makes a chunk longer)."""
        if chunk_index == 0:
            return first_override if first_override is not None else self.first_frames
        i = chunk_index - 1
        return self.ramp_frames[i] if i < len(self.ramp_frames) else self.steady_frames


@dataclass(frozen=True)
class TextConfig:
    """Text feeding for clause-granularity models (the embedded voice)."""

    first_fragment_min_chars: int = 3  # the first clause of a turn may be released this short
    first_fragment_min_words: int = 3  # ...or cut before a phrase-starting word ("for", "and") after this many
    first_fragment_max_words: int = 12  # ...and is forced out at a word boundary after this many words
    clause_min_chars: int = 24  # later clauses are merged up to this length for prosody
    max_clause_chars: int = 300  # no clause is longer: cut at its last word boundary, or hard with none
    # A run with no whitespace is cut (a space inserted) after this many characters, so the clause
    # feeder always has a boundary and no front end reads one enormous "word". English words and
    # most URLs are shorter.
    max_word_chars: int = 64
    max_marks_per_char: int = 4  # combining marks kept on one base character (Zalgo text has dozens)
    # A turn ends with ``text_budget_exceeded`` once its model time exceeds this much plus
    # ``turn_budget_per_audio_s`` per second of audio it produced. Real speech costs the embedded
    # voice about 0.01 s per audio second; text that costs model time without making audio
    # (symbols a voice cannot read, a front end's worst case) is what the budget stops.
    turn_budget_s: float = 3.0
    turn_budget_per_audio_s: float = 0.25


@dataclass(frozen=True)
class LevelConfig:
    """Output level and lead-in handling."""

    onset_threshold_dbfs: float = ONSET_THRESHOLD_DBFS  # a 10 ms window above this is audible
    first_preroll_ms: float = 10.0  # kept before the first audible window of a turn
    max_trim_ms: float = 1000.0  # never hold back more than this waiting for the first audible sound


@dataclass(frozen=True)
class EngineConfig:
    model: str = "hibari"  # "hibari" | "qwen3-tts"
    model_options: dict[str, object] = field(default_factory=dict)
    chunks: ChunkSchedule = field(default_factory=ChunkSchedule)
    text: TextConfig = field(default_factory=TextConfig)
    level: LevelConfig = field(default_factory=LevelConfig)
    max_streams: int = 256  # streams open at once (engine-wide)
    # Opens past the limit wait in a FIFO for a stream to end, at most this many and this long,
    # before failing with server_busy: a burst rides on the streams that finish within the wait
    # instead of being refused while capacity frees a few ms later.
    max_queued_streams: int = 64
    queue_wait_s: float = 0.5
    max_buffered_text_chars: int = 20_000  # per stream, not yet spoken
    max_ahead_s: float = 30.0  # a stream whose caller has not taken this much of its audio stops generating
    # decode the chunks of earlier steps while the next frame steps run (Model.decode_start), taking
    # their audio once it is done; a model without a stage 2 of its own queue does both in turn
    # either way
    overlap_decode: bool = True
    # queue the next frame step behind the running one before taking that one's results, where the
    # model allows it (Model.steps_in_flight): the device runs steps back to back while the worker
    # records, plans and hands out audio; a stream that ends in one step may run one more, discarded
    queue_ahead: bool = True
    # ... but only behind a step of at least this many rows: a new stream's first frame waits for
    # every step queued before it, and at a few rows the device has time to spare for a gap
    queue_ahead_min_rows: int = 64
    # codec work begun and not yet handed out, past which the worker waits for the oldest: a stage 2
    # that falls behind holds the frame steps back instead of letting its audio, and a new stream's
    # first chunk queued behind it, grow later and later
    max_decodes_in_flight: int = 1
    # chunks of streams less than this far ahead of their listener (every first chunk among them)
    # are decoded apart from the rest, on the model's urgent lane where it has one
    # (Model.urgent_decode): a new stream's first audio, and the next chunks that keep it playing,
    # then wait for no bulk codec work of the streams seconds ahead. 0: one piece of codec work a tick
    urgent_slack_s: float = 0.2
    # a frame step of at most this many rows is a quiet device's, which has time to spare. There,
    # (1) with urgent codec work out (a new stream's first chunk) and no step in flight, the next
    # step waits for it, none of its streams new, in a lead-in the trim holds back or within
    # urgent_slack_s of running dry: side by side the two share the device's SMs and the chunk
    # takes about twice as long; (2) while such a step runs, the worker takes commands, and a new
    # stream's first frame is queued behind it at once, whatever queue_ahead_min_rows says.
    # 0: neither
    quiet_rows: int = 16
    # the worker's time in stream commands (opens, text pushes, ends) between two steps, the rest
    # waiting for the next gap: text pushed a word at a time by hundreds of streams must not hold
    # every stream's next frame for as long as it keeps coming. inf: every queued command first
    command_budget_s: float = 0.005
    # once warm, exempt the process's startup heap (modules, the model, its graphs) from the garbage
    # collector (heap.py): a full collection otherwise walks all of it, 100-125 ms with the GIL held,
    # every several seconds under load, and the streams in their first 100 ms of audio run dry
    freeze_heap: bool = True
    # with it, the oldest generation collected at the moments no stream is in flight (heap.py's
    # QuietCollections), not every few seconds under load; busy without a break for this long, the
    # collector's own rule until the next quiet moment. 0: the collector's own rule throughout. None:
    # where the engine runs decides: an engine core holds (core/process.py), an engine in a gateway's
    # process does not (the gateway paces a turn's audio for seconds after the engine is done with it,
    # and a collection at the engine's quiet moment would stall every packet behind it)
    full_collection_busy_max_s: float | None = None
    max_batch: int | None = None  # streams per generate step, at most the model's; None: the model's
