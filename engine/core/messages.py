"""The wire format between the gateway (``CoreClient``) and an engine core (``process.py``).

Every message is one or two frames of a ZeroMQ multipart message (a multipart message carries the
messages put in one pass of the sender's loop, outgoing.py): the first a msgpack array
``[kind, field, field, ...]`` (fields in the order of the dataclass below); an ``Audio`` message
has a second frame with the chunk's PCM as raw little-endian float32 bytes, so audio crosses as
one buffer copy and is never pickled (its words ride the header as ``[word, start, end]``).
Float32 (not int16) keeps the audio bit-identical to the in-process engine; it is 96 KB/s per stream at 24 kHz, nothing next to a local socket's rate.

Two sockets per core, both bound by the gateway side (so a restarted core just reconnects):
``to_core`` (PUSH -> PULL) carries stream commands, consumption reports and clone requests,
``from_core`` (PUSH -> PULL) carries audio, stream ends, cloned voices and the core's state.

A cloned voice in a stream's options (``StreamParams.extra[CLONED_VOICE_KEY]``) crosses whole, as a
msgpack extension (its arrays as raw bytes + dtype + shape), rather than as a voice id the core
would look up: the core then holds no voice state (nothing to invalidate when a voice is deleted,
no voices directory shared between processes or hosts), and a voice is 5-50 KB, once per stream.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, fields
from typing import Any, TypeAlias

import msgpack
import numpy as np

from voicewire.engine import (
    AudioChunk,
    ClonedVoice,
    EngineStats,
    ModelInfo,
    StreamParams,
    TextGranularity,
    WordTiming,
)
from voicewire.engine.commands import Cancel, End, Flush, PushText

PCM_DTYPE = np.dtype("<f4")


class Kind(enum.IntEnum):
    # gateway -> core
    OPEN = 1
    TEXT = 2
    FLUSH = 3
    END = 4
    CANCEL = 5
    CONSUMED = 6
    SHUTDOWN = 7
    CLONE = 8
    ATTACH = 9  # gateway -> a shared core's events socket (gateways.py)
    # core -> gateway
    READY = 16
    START_FAILED = 17
    AUDIO = 18
    FAILED = 19
    CLOSED = 20
    STATS = 21
    CLONED = 22
    CLONE_FAILED = 23
    LISTENING = 24  # a shared core -> the process that started it (shared_core.py)


CLONED_VOICE_EXT = 1  # msgpack extension code of a ClonedVoice


@dataclass(frozen=True)
class OpenStream:
    """A new stream; ``stream_id`` is chosen by the gateway side, unique for the client's life."""

    stream_id: int
    params: StreamParams


@dataclass(frozen=True)
class Consumed:
    """The caller has taken ``samples`` of this stream's audio (the core's backpressure input)."""

    stream_id: int
    samples: int


@dataclass(frozen=True)
class CloneVoice:
    """Derive a cloned voice from a reference clip (``Engine.clone_voice``); the PCM goes as its own frame."""

    request_id: int
    pcm: np.ndarray  # float32 mono
    sample_rate_hz: int
    ref_text: str


@dataclass(frozen=True)
class Shutdown:
    """Finish every stream with ``engine_closed`` and exit."""


@dataclass(frozen=True)
class Ready:
    """Warmed up and stepping: what the gateway side needs to admit streams on its own."""

    info: ModelInfo
    max_streams: int  # streams the core takes at once (the engine's limit and the model's slots)
    pid: int


@dataclass(frozen=True)
class StartFailed:
    """The model could not load or warm up; the core exits after sending this."""

    message: str


@dataclass(frozen=True)
class Audio:
    """One chunk of a stream's audio; a final chunk ends the stream (its slot is free)."""

    stream_id: int
    chunk: AudioChunk
    trimmed_samples: int  # lead-in silence the engine dropped before this stream's first audio


@dataclass(frozen=True)
class Failed:
    """The stream ended with a ``StreamError`` (its slot is free)."""

    stream_id: int
    code: str
    message: str


@dataclass(frozen=True)
class Closed:
    """A cancelled stream is gone from the core (its slot is free)."""

    stream_id: int


@dataclass(frozen=True)
class VoiceCloned:
    request_id: int
    voice: ClonedVoice


@dataclass(frozen=True)
class CloneFailed:
    """``code``: cloning_not_supported | bad_audio (the model refused the clip) | not_ready | model_error."""

    request_id: int
    code: str
    message: str


@dataclass(frozen=True)
class Stats:
    """The core's counters, sent periodically; also its heartbeat."""

    stats: EngineStats
    active_streams: int


@dataclass(frozen=True)
class Attach:
    """A gateway in front of a shared core (one reached over TCP, gateways.py), about once a
    second: the core answers the first with its ``Ready``, sends the gateway every message about
    the streams whose ids carry its ``tag`` and its ``Stats``, and cancels its streams when it falls
    silent."""

    tag: int


@dataclass(frozen=True)
class Listening:
    """Where a shared core's gateways connect (tcp:// addresses): its first message to the process
    that started it, before the model loads."""

    commands: str
    events: str


TAG_SHIFT = 32  # a shared core's stream and request ids: tag << TAG_SHIFT | n, unique across gateways


def id_tag(message_id: int) -> int:
    return message_id >> TAG_SHIFT


def encode_attach(msg: Attach) -> list[bytes]:
    return [_pack(Kind.ATTACH, msg.tag)]


def peek(frame0: bytes) -> tuple[Kind, list[Any]]:
    """A message's kind and its header's fields (the first is the stream or request id of those
    that have one), leaving any PCM frame alone."""
    kind, *rest = _unpack(frame0)
    return Kind(kind), rest


ToCore: TypeAlias = OpenStream | PushText | Flush | End | Cancel | Consumed | CloneVoice | Shutdown
FromCore: TypeAlias = (
    Ready | StartFailed | Audio | Failed | Closed | Stats | VoiceCloned | CloneFailed | Listening
)

_STREAM_COMMANDS: dict[type, Kind] = {Flush: Kind.FLUSH, End: Kind.END, Cancel: Kind.CANCEL}
_STREAM_COMMAND_TYPES: dict[int, type] = {kind: cls for cls, kind in _STREAM_COMMANDS.items()}
_WITH_PCM = (Kind.AUDIO, Kind.CLONE)  # the kinds whose PCM follows the header as a frame of its own


def _pack(*items: Any) -> bytes:
    return msgpack.packb(items, use_bin_type=True, default=_pack_ext)


def _pack_ext(obj: object) -> msgpack.ExtType:
    if isinstance(obj, ClonedVoice):
        arrays = [
            [name, a.dtype.str, list(a.shape), np.ascontiguousarray(a).tobytes()]
            for name, a in obj.arrays.items()
        ]
        return msgpack.ExtType(CLONED_VOICE_EXT, _pack(obj.encoder, obj.ref_text, arrays))
    raise TypeError(f"cannot serialize {type(obj).__name__}")


def _unpack_ext(code: int, data: bytes) -> object:
    if code != CLONED_VOICE_EXT:
        return msgpack.ExtType(code, data)
    encoder, ref_text, arrays = _unpack(data)
    return ClonedVoice(
        encoder,
        {
            name: np.frombuffer(raw, np.dtype(dtype)).reshape(shape).copy()
            for name, dtype, shape, raw in arrays
        },
        ref_text,
    )


def _unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False, ext_hook=_unpack_ext)


def encode_to_core(msg: ToCore) -> list[bytes]:
    """Frames for one message to the core. Raises ValueError for stream params msgpack cannot carry."""
    if isinstance(msg, PushText):
        return [_pack(Kind.TEXT, msg.stream_id, msg.delta)]
    if isinstance(msg, Flush | End | Cancel):
        return [_pack(_STREAM_COMMANDS[type(msg)], msg.stream_id)]
    if isinstance(msg, Consumed):
        return [_pack(Kind.CONSUMED, msg.stream_id, msg.samples)]
    if isinstance(msg, CloneVoice):
        pcm = np.ascontiguousarray(msg.pcm, PCM_DTYPE)
        return [_pack(Kind.CLONE, msg.request_id, msg.sample_rate_hz, msg.ref_text), pcm.tobytes()]
    if isinstance(msg, OpenStream):
        params = [getattr(msg.params, f.name) for f in fields(StreamParams)]
        try:
            return [_pack(Kind.OPEN, msg.stream_id, params)]
        except TypeError as err:
            raise ValueError(f"stream options an engine core cannot receive: {err}") from None
    return [_pack(Kind.SHUTDOWN)]


def decode_to_core(frames: list[bytes]) -> ToCore:
    return _to_core(*next(_messages(frames)))


def decode_all_to_core(frames: list[bytes]) -> list[ToCore]:
    """Every message of a batch (outgoing.py), in the order they were put."""
    return [_to_core(*m) for m in _messages(frames)]


def _to_core(kind: int, rest: list[Any], data: bytes) -> ToCore:
    if kind == Kind.TEXT:
        return PushText(rest[0], rest[1])
    if kind in _STREAM_COMMAND_TYPES:
        return _STREAM_COMMAND_TYPES[kind](rest[0])
    if kind == Kind.CONSUMED:
        return Consumed(rest[0], rest[1])
    if kind == Kind.CLONE:
        return CloneVoice(rest[0], np.frombuffer(data, PCM_DTYPE), rest[1], rest[2])
    if kind == Kind.OPEN:
        return OpenStream(rest[0], StreamParams(*rest[1]))
    if kind == Kind.SHUTDOWN:
        return Shutdown()
    raise ValueError(f"not a message to an engine core: kind {kind}")


def encode_from_core(msg: FromCore) -> list[bytes]:
    """Frames for one message from the core; an ``Audio`` message's PCM goes as its own frame."""
    if isinstance(msg, Audio):
        c = msg.chunk
        pcm = np.ascontiguousarray(c.pcm, PCM_DTYPE)
        header = _pack(
            Kind.AUDIO, msg.stream_id, c.sample_rate_hz, c.sample_offset, c.final, c.text, msg.trimmed_samples,
            c.stop_reason, [[w.word, w.start, w.end] for w in c.words],
        )  # fmt: skip
        return [header, pcm.tobytes()]
    if isinstance(msg, Failed):
        return [_pack(Kind.FAILED, msg.stream_id, msg.code, msg.message)]
    if isinstance(msg, Closed):
        return [_pack(Kind.CLOSED, msg.stream_id)]
    if isinstance(msg, VoiceCloned):
        return [_pack(Kind.CLONED, msg.request_id, msg.voice)]
    if isinstance(msg, CloneFailed):
        return [_pack(Kind.CLONE_FAILED, msg.request_id, msg.code, msg.message)]
    if isinstance(msg, Stats):
        st = msg.stats
        counters = [getattr(st, f.name) for f in fields(EngineStats) if f.name != "batch_sizes"]
        return [_pack(Kind.STATS, msg.active_streams, counters, dict(st.batch_sizes))]
    if isinstance(msg, Ready):
        info = [getattr(msg.info, f.name) for f in fields(ModelInfo)]
        info[[f.name for f in fields(ModelInfo)].index("text_granularity")] = msg.info.text_granularity.value
        return [_pack(Kind.READY, info, msg.max_streams, msg.pid)]
    if isinstance(msg, Listening):
        return [_pack(Kind.LISTENING, msg.commands, msg.events)]
    return [_pack(Kind.START_FAILED, msg.message)]


def decode_from_core(frames: list[bytes]) -> FromCore:
    return _from_core(*next(_messages(frames)))


def decode_all_from_core(frames: list[bytes]) -> list[FromCore]:
    """Every message of a batch (outgoing.py), in the order they were put."""
    return [_from_core(*m) for m in _messages(frames)]


def _messages(frames: list[bytes]) -> Iterator[tuple[int, list[Any], bytes]]:
    """Each message's kind, header fields and PCM frame (b"" for the kinds that have none)."""
    i = 0
    while i < len(frames):
        kind, *rest = _unpack(frames[i])
        if kind in _WITH_PCM:
            yield kind, rest, frames[i + 1]
            i += 2
        else:
            yield kind, rest, b""
            i += 1


def _from_core(kind: int, rest: list[Any], data: bytes) -> FromCore:
    if kind == Kind.AUDIO:
        sid, rate_hz, offset, final, text, trimmed, stop_reason, words = rest
        # A read-only view of the received buffer: no copy on this side either.
        pcm = np.frombuffer(data, PCM_DTYPE)
        chunk = AudioChunk(
            pcm, rate_hz, offset, final=final, text=text, stop_reason=stop_reason,
            words=tuple(WordTiming(w, start, end) for w, start, end in words),
        )  # fmt: skip
        return Audio(sid, chunk, trimmed)
    if kind == Kind.FAILED:
        return Failed(rest[0], rest[1], rest[2])
    if kind == Kind.CLOSED:
        return Closed(rest[0])
    if kind == Kind.CLONED:
        return VoiceCloned(rest[0], rest[1])
    if kind == Kind.CLONE_FAILED:
        return CloneFailed(rest[0], rest[1], rest[2])
    if kind == Kind.STATS:
        active, counters, batches = rest
        names = [f.name for f in fields(EngineStats) if f.name != "batch_sizes"]
        stats = EngineStats(**dict(zip(names, counters, strict=True)), batch_sizes=Counter(batches))
        return Stats(stats, active)
    if kind == Kind.READY:
        info, max_streams, pid = rest
        values = dict(zip([f.name for f in fields(ModelInfo)], info, strict=True))
        values["text_granularity"] = TextGranularity(values["text_granularity"])
        values["voices"] = tuple(values["voices"])
        values["slack_chunk_frames"] = tuple((float(s), int(n)) for s, n in values["slack_chunk_frames"])
        return Ready(ModelInfo(**values), max_streams, pid)
    if kind == Kind.START_FAILED:
        return StartFailed(rest[0])
    if kind == Kind.LISTENING:
        return Listening(rest[0], rest[1])
    raise ValueError(f"not a message from an engine core: kind {kind}")
