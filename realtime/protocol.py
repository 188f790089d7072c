"""Protocol v1: the JSON control messages shared by the WebSocket and the WebRTC data channel.

Client -> server (one JSON object per text message):
    session.update  {"format": "pcm16"|"opus"|"mulaw"|"alaw", "sample_rate": 8000|24000|48000, "voice": str}
                    all optional; mulaw / alaw (G.711, telephony.py; also named ulaw, ulaw_8000,
                    pcm_mulaw, alaw_8000, pcm_alaw) are 8000 Hz only, and imply it
    text.delta      {"turn_id": T, "text": str, "voice": str, "speed": 0.5..2.0, "language": str,
                     "instructions": str}   the four options optional, read from a turn's first delta
    text.flush      {"turn_id": T}
    text.end        {"turn_id": T}
    turn.cancel     {"turn_id": T, "played_ms": number >= 0}   played_ms optional; also after turn.done
Server -> client:
    session.created {"session_id", "protocol": 1, "audio": {...}, "limits": {...}}
    session.updated {"audio": {...}}
    turn.started    {"turn_id"}
    turn.words      {"turn_id", "words": [{"word", "start_ms", "end_ms", "char_start", "char_end"}, ...]}
    turn.done       {"turn_id", "reason": "completed"|"cancelled"|"error"|"timeout"|"length", "audio_ms", "played_ms",
                     "played_source": "client"|"paced"|"sent", "text_spoken", "metrics": {...}}
    turn.truncated  {"turn_id", "audio_ms", "played_ms", "played_source": "client", "text_spoken"}
    error           {"code", "message", "turn_id"?}
T is a string or an integer, echoed back as given. Parsing is pure: bad input raises
``ProtocolError`` with a stable code, and nothing else.

Word timings. ``turn.words`` gives the words whose audio starts in the audio that follows it: on
the WebSocket it comes before the binary message holding each word's first sample; on WebRTC the
data channel carries it when the pacer sends the frame holding that sample. ``start_ms`` /
``end_ms`` count from the turn's first audio sample (sample-accurate, at the engine's rate); the
words come in order, each once, and cover the text the voice speaks (text it cannot read, such as
emoji, has no word); ``char_start`` / ``char_end`` are the word's span in the turn's text as the
client sent it (its ``text.delta`` texts joined), so ``text[:char_end]`` is the text up to it. A
client that ignores unknown message types keeps working. Example (WebSocket):

    -> {"type":"text.delta","turn_id":1,"text":"Sure, I can "}
    <- {"type":"turn.started","turn_id":1}
    <- {"type":"turn.words","turn_id":1,"words":[{"word":"Sure,","start_ms":45.0,"end_ms":395.0,
        "char_start":0,"char_end":5}]}
    <- (binary: the audio of "Sure,")
    -> {"type":"text.delta","turn_id":1,"text":"help with that."}
    -> {"type":"text.end","turn_id":1}
    <- {"type":"turn.words","turn_id":1,"words":[{"word":"I","start_ms":520.0,"end_ms":645.0,
        "char_start":6,"char_end":7},{"word":"can","start_ms":695.0,"end_ms":770.0,"char_start":8,"char_end":11},...]}
    <- (binary: the audio of "I can help with that.")
    -> {"type":"turn.cancel","turn_id":1,"played_ms":700}
    <- {"type":"turn.done","turn_id":1,"reason":"cancelled","audio_ms":1820.0,"played_ms":700.0,
        "played_source":"client","text_spoken":"Sure, I","metrics":{...}}

Played audio. ``played_ms`` of ``turn.done`` is ``"client"``: the position the client reported with
``turn.cancel`` (capped at the audio sent); ``"paced"``: what the WebRTC pacer sent on the wall
clock; ``"sent"``: the audio sent on the WebSocket (no report). ``text_spoken`` is the turn's text up
to the last word whose first half played (from the word timings), or all of it when completed.

Played audio after the fact. The WebSocket sends a reply faster than it plays, so its ``turn.done``
(``completed``) often comes long before the listener barges in. A ``turn.cancel`` with
``played_ms`` for a turn that is already done (one of the session's last 4 finished turns) is
answered with ``turn.truncated``: the turn's ``played_ms`` (capped at ``audio_ms``) and the
``text_spoken`` up to that position, cut as a cancel before the end would have cut it (what
OpenAI Realtime's ``conversation.item.truncate`` answers with ``conversation.item.truncated``). It
may be sent again (the last answer is the turn's account); it changes nothing else: the turn
stays done and the turns after it play on. A cancel without ``played_ms`` for a done turn is
ignored, as before. A cancel that reaches the server before the turn's end still ends it with
``turn.done`` (``cancelled``), and no ``turn.truncated`` follows. Example (an 8.5 s reply, all
sent within 300 ms):

    <- {"type":"turn.done","turn_id":7,"reason":"completed","audio_ms":8460.0,"played_ms":8460.0,
        "played_source":"sent","text_spoken":"Let me walk you through ...","metrics":{...}}
    -> {"type":"turn.cancel","turn_id":7,"played_ms":1000}
    <- {"type":"turn.truncated","turn_id":7,"audio_ms":8460.0,"played_ms":1000.0,
        "played_source":"client","text_spoken":"Let me walk you"}
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

PROTOCOL_VERSION = 1
MAX_MESSAGE_BYTES = 64 * 1024  # one client message; larger closes the WebSocket with 1009
MAX_TEXT_CHARS = 8_192  # one text.delta
MAX_INSTRUCTIONS_CHARS = 1_000  # a turn's instructions: a style, not a document
MAX_TURN_ID_CHARS = 128
MAX_TURN_ID_INT = 2**53 - 1  # JavaScript's largest exact integer: every client can echo it back
AUDIO_FORMATS = ("pcm16", "opus", "mulaw", "alaw")
SAMPLE_RATES_HZ = (8_000, 24_000, 48_000)
G711_FORMATS = ("mulaw", "alaw")
G711_RATE_HZ = 8_000
# The G.711 names of other TTS APIs (ElevenLabs ulaw_8000 / alaw_8000, Cartesia pcm_mulaw /
# pcm_alaw) -> ours, so a client written for one of them needs no table of its own.
G711_ALIASES = {
    "mulaw": "mulaw",
    "ulaw": "mulaw",
    "ulaw_8000": "mulaw",
    "pcm_mulaw": "mulaw",
    "alaw": "alaw",
    "alaw_8000": "alaw",
    "pcm_alaw": "alaw",
}
MAX_PLAYED_MS = 86_400_000.0  # a day: larger is no playback position (Infinity parses in Python)
MAX_ECHO_CHARS = 100  # of a client's value quoted back in an error: enough to recognize it by

TurnId = str | int


class ProtocolError(Exception):
    """Bad client input. ``code`` is stable and documented; ``message`` is for humans."""

    def __init__(self, code: str, message: str, turn_id: TurnId | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.turn_id = turn_id


@dataclass(frozen=True)
class SessionUpdate:
    format: str | None = None
    sample_rate: int | None = None
    voice: str | None = None


@dataclass(frozen=True)
class TurnOptions:
    """What a turn's first ``text.delta`` may choose for that turn alone (None: the session's)."""

    voice: str | None = None
    speed: float | None = None  # 0.5 .. 2.0
    language: str | None = None  # models with languages (Qwen3-TTS)
    instructions: str | None = None  # models that take them (Qwen3-TTS 1.7B)


@dataclass(frozen=True)
class TextDelta:
    turn_id: TurnId
    text: str
    options: TurnOptions = TurnOptions()  # heeded on the turn's first delta only


@dataclass(frozen=True)
class TextFlush:
    turn_id: TurnId


@dataclass(frozen=True)
class TextEnd:
    turn_id: TurnId


@dataclass(frozen=True)
class TurnCancel:
    turn_id: TurnId
    played_ms: float | None = None  # the client's playback position in the turn's audio


ClientMessage = SessionUpdate | TextDelta | TextFlush | TextEnd | TurnCancel


def _turn_id(msg: dict[str, Any]) -> TurnId:
    if "turn_id" not in msg:
        raise ProtocolError("missing_field", "turn_id is required")
    tid = msg["turn_id"]
    if isinstance(tid, bool) or not isinstance(tid, (str, int)):
        raise ProtocolError("invalid_field", "turn_id must be a string or an integer")
    if isinstance(tid, str) and not 0 < len(tid) <= MAX_TURN_ID_CHARS:
        raise ProtocolError("invalid_field", f"turn_id must be 1..{MAX_TURN_ID_CHARS} characters")
    if isinstance(tid, int) and not -MAX_TURN_ID_INT <= tid <= MAX_TURN_ID_INT:
        raise ProtocolError("invalid_field", f"an integer turn_id must be within ±{MAX_TURN_ID_INT}")
    return tid


def _optional(msg: dict[str, Any], key: str, kind: type, turn_id: TurnId | None = None) -> Any:
    if key not in msg or msg[key] is None:
        return None
    value = msg[key]
    if isinstance(value, bool) or not isinstance(value, kind):
        raise ProtocolError("invalid_field", f"{key} must be a {kind.__name__}", turn_id)
    return value


def parse_client_message(raw: str | bytes) -> ClientMessage:
    """One client text message -> a typed message. Raises ProtocolError."""
    if isinstance(raw, bytes):
        raise ProtocolError("binary_not_supported", "clients send JSON text messages only")
    if len(raw) > MAX_MESSAGE_BYTES:
        raise ProtocolError("message_too_large", f"messages are limited to {MAX_MESSAGE_BYTES} bytes")
    try:
        msg = json.loads(raw)
    # ValueError: JSONDecodeError, and integers past Python's 4,300-digit limit; RecursionError:
    # nesting deeper than the parser's stack.
    except (ValueError, RecursionError) as err:
        raise ProtocolError("invalid_json", f"not valid JSON: {str(err)[:200]}") from None
    if not isinstance(msg, dict):
        raise ProtocolError("invalid_message", "a message must be a JSON object")
    kind = msg.get("type")
    if not isinstance(kind, str):
        raise ProtocolError("missing_field", "type is required and must be a string")
    if kind == "session.update":
        fmt = _optional(msg, "format", str)
        fmt = G711_ALIASES.get(fmt, fmt) if fmt is not None else None
        if fmt is not None and fmt not in AUDIO_FORMATS:
            raise ProtocolError("invalid_field", f"format must be one of {', '.join(AUDIO_FORMATS)}")
        rate = _optional(msg, "sample_rate", int)
        if rate is not None and rate not in SAMPLE_RATES_HZ:
            raise ProtocolError("invalid_field", "sample_rate must be 8000, 24000 or 48000")
        if fmt in G711_FORMATS:
            if rate not in (None, G711_RATE_HZ):
                raise ProtocolError("invalid_field", f"{fmt} is {G711_RATE_HZ} Hz only")
            rate = G711_RATE_HZ
        return SessionUpdate(fmt, rate, _optional(msg, "voice", str))
    if kind == "text.delta":
        tid = _turn_id(msg)
        if "text" not in msg:
            raise ProtocolError("missing_field", "text is required", tid)
        text = _optional(msg, "text", str, tid)
        if text is None:
            raise ProtocolError("invalid_field", "text must be a str", tid)
        if len(text) > MAX_TEXT_CHARS:
            raise ProtocolError(
                "text_too_long", f"one text.delta holds at most {MAX_TEXT_CHARS} characters", tid
            )
        speed = msg.get("speed")
        if speed is not None and (
            isinstance(speed, bool) or not isinstance(speed, (int, float)) or not 0.5 <= speed <= 2.0
        ):
            raise ProtocolError("invalid_field", "speed must be a number within 0.5..2.0", tid)
        instructions = _optional(msg, "instructions", str, tid)
        if instructions is not None and len(instructions) > MAX_INSTRUCTIONS_CHARS:
            raise ProtocolError("invalid_field", f"instructions are at most {MAX_INSTRUCTIONS_CHARS} characters", tid)
        options = TurnOptions(
            _optional(msg, "voice", str, tid),
            None if speed is None else float(speed),
            _optional(msg, "language", str, tid),
            instructions,
        )
        return TextDelta(tid, text, options)
    if kind == "text.flush":
        return TextFlush(_turn_id(msg))
    if kind == "text.end":
        return TextEnd(_turn_id(msg))
    if kind == "turn.cancel":
        tid = _turn_id(msg)
        played = msg.get("played_ms")
        if played is None:
            return TurnCancel(tid)
        if isinstance(played, bool) or not isinstance(played, (int, float)):
            raise ProtocolError("invalid_field", "played_ms must be a number", tid)
        if not 0 <= played < MAX_PLAYED_MS:  # also refuses NaN (every comparison is false)
            raise ProtocolError("invalid_field", f"played_ms must be within 0..{MAX_PLAYED_MS}", tid)
        return TurnCancel(tid, float(played))
    raise ProtocolError("unknown_type", f"unknown message type {echo(kind)}")


def echo(value: str) -> str:
    """A client's ``value`` quoted for an error message, at most MAX_ECHO_CHARS of it: a 64 KiB
    name must not come back whole (nor into the log line that records the error)."""
    if len(value) <= MAX_ECHO_CHARS:
        return repr(value)
    return f"{value[:MAX_ECHO_CHARS]!r}... ({len(value)} characters)"


def error_message(code: str, message: str, turn_id: TurnId | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "error", "code": code, "message": message}
    if turn_id is not None:
        out["turn_id"] = turn_id
    return out


def dumps(msg: dict[str, Any]) -> str:
    return json.dumps(msg, separators=(",", ":"))
