"""What a stream brings the worker: its open and its text, on their way into the model.

An open becomes a ``Live`` (live.py): its scheduler request, the text feeder the model's granularity
asks for, and the lead-in trim. Text goes through the feeder (word by word, or clause by clause) to
``Model.add_text``, with a cap on what a stream may buffer ahead of what it has spoken.
"""

from __future__ import annotations

import time

from .commands import End, Flush, PushText
from .config import EngineConfig
from .level import LeadInTrimmer
from .live import Live
from .model import Model, StreamParams, TextGranularity
from .scheduler import Request
from .stream import Stream, StreamError
from .text_feeder import ClauseFeeder, WordFeeder


def new_live(stream: Stream, params: StreamParams, slot: int, model: Model, config: EngineConfig) -> Live:
    """The worker-side state of a stream opening in ``slot`` (the slot is not opened in the model yet)."""
    info = model.info
    request = Request(
        stream_id=stream.id,
        slot=slot,
        t_arrival=time.perf_counter(),
        tenant=params.tenant,
        first_chunk_frames=params.first_chunk_frames,
        sample_rate_hz=info.sample_rate_hz,
    )
    lvl = config.level
    return Live(
        stream=stream,
        loop=stream.loop,
        request=request,
        feeder=(
            ClauseFeeder(config.text) if info.text_granularity is TextGranularity.CLAUSE else WordFeeder(config.text)
        ),
        trimmer=LeadInTrimmer(info.sample_rate_hz, lvl.onset_threshold_dbfs, lvl.first_preroll_ms, lvl.max_trim_ms),
    )


def take_text(model: Model, live: Live, cmd: PushText | Flush | End, max_buffered_chars: int) -> None:
    """A text command given to the model. Raises StreamError (text_overflow) past the buffer cap,
    ModelError from the model."""
    if isinstance(cmd, PushText):
        live.buffered_chars += len(cmd.delta)
        if live.buffered_chars - len(live.stream.metrics.text_spoken) > max_buffered_chars:
            raise StreamError("text_overflow", "too much text buffered for this stream")
        pieces, final = live.feeder.feed(cmd.delta), False
    else:
        pieces, final = live.feeder.flush(), isinstance(cmd, End)
    if pieces or final:
        model.add_text(live.request.slot, pieces, final)
    if live.request.t_first_emit is None and pieces:
        live.request.t_arrival = min(live.request.t_arrival, time.perf_counter())
