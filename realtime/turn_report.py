"""A turn's account of the audio it sent, and the reports a session builds from it.

Each chunk handed to the transport adds to the turn's account (``note_chunk``): when the first audio
left, what a listener playing from it would have stalled on, the first audible sample, and where
each chunk's text lies in the audio. ``turn.done`` reports it when the turn ends; ``turn.truncated``
reports a finished turn again at the position the client later says it played to. A cut turn
reports the words its played audio spoke (from the word timings, or an estimate inside the last
chunk without them: truncation.py), so the agent can truncate its context to what was heard.
"""

from __future__ import annotations

import time
from typing import Any

from voicewire.engine import AudioChunk, Playout, first_audible_sample

from .protocol import TurnId
from .truncation import SpokenRecord, TextSpan
from .turn import Turn


def note_chunk(turn: Turn, chunk: AudioChunk, listener: Playout, threshold_dbfs: float) -> None:
    """A chunk with audio, about to be handed to the transport, entered in the turn's account."""
    now = time.perf_counter()
    if turn.t_first_audio_sent is None:
        turn.t_first_audio_sent = now
    listener.arrive(now, chunk.pcm.size / chunk.sample_rate_hz)
    turn.underruns = listener.underruns
    if turn.first_audible_sample is None:
        onset = first_audible_sample(chunk.pcm, chunk.sample_rate_hz, threshold_dbfs)
        if onset is not None:
            turn.first_audible_sample = turn.samples_sent + onset
    if chunk.text:
        turn.text_sent.append(chunk.text)
        turn.text_spans.append(
            TextSpan.of_chunk(chunk.text, chunk.pcm, turn.samples_sent, chunk.sample_rate_hz, threshold_dbfs)
        )
    turn.samples_sent += chunk.pcm.size
    turn.t_last_activity = time.monotonic()


def spoken_record(turn: Turn) -> SpokenRecord:
    return SpokenRecord(turn.text_in.text, tuple(turn.words), tuple(turn.text_spans), turn.samples_sent)


def done_message(turn: Turn, reason: str, played_ms: float, played_source: str, rate_hz: int) -> dict[str, Any]:
    """``turn.done``; ``rate_hz`` is the engine's sample rate (the turn's samples are counted in it)."""
    m = turn.stream.metrics
    if reason in ("completed", "length"):
        text = " ".join(turn.text_sent)
    else:
        text = spoken_record(turn).text_spoken(round(played_ms * rate_hz / 1000))
    metrics: dict[str, Any] = {
        "trimmed_ms": round(m.trimmed_samples * 1000 / rate_hz, 1),
        "underruns": turn.underruns,
    }
    if turn.t_first_audio_sent is not None:
        metrics["ttfp_ms"] = round((turn.t_first_audio_sent - turn.t_first_text) * 1000, 2)
        if turn.first_audible_sample is not None:
            # Audible TTFA at the gateway: the first audible sample's place in the audio, for a
            # listener who plays from the first packet (the engine keeps 10 ms before it).
            ttfa_s = turn.t_first_audio_sent - turn.t_first_text + turn.first_audible_sample / rate_hz
            metrics["ttfa_ms"] = round(ttfa_s * 1000, 2)
    if m.ttfp_s is not None:
        metrics["engine_ttfp_ms"] = round(m.ttfp_s * 1000, 2)
    return {
        "type": "turn.done",
        "turn_id": turn.turn_id,
        "reason": reason,
        "audio_ms": round(turn.samples_sent * 1000 / rate_hz, 1),
        "played_ms": round(played_ms, 1),
        "played_source": played_source,
        "text_spoken": text,
        "metrics": metrics,
    }


def truncated_message(turn_id: TurnId, record: SpokenRecord, played_ms: float, rate_hz: int) -> dict[str, Any]:
    """``turn.truncated``: a finished turn's account at the position the client played it to (its
    ``turn.done`` told what was sent, which over the WebSocket is all of a reply long before it has
    played)."""
    audio_ms = record.samples * 1000 / rate_hz
    played_ms = min(played_ms, audio_ms)  # never more than the client got
    return {
        "type": "turn.truncated",
        "turn_id": turn_id,
        "audio_ms": round(audio_ms, 1),
        "played_ms": round(played_ms, 1),
        "played_source": "client",
        "text_spoken": record.text_spoken(round(played_ms * rate_hz / 1000)),
    }
