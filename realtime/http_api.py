"""HTTP API, OpenAI-compatible: ``POST /v1/audio/speech`` (streamed as raw audio or as SSE speech
events, in any of ``FORMATS``: encoders.py), ``GET /v1/models``; and ``GET /healthz`` (alias
``/health``). The voices API is ``voices_api.py``."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from aiohttp import web

from voicewire.engine import (
    AudioChunk,
    EngineBusy,
    EngineNotReady,
    ModelInfo,
    Stream,
    StreamError,
    StreamParams,
)

from .encoders import speech_encoder
from .gateway import GATEWAY, RequestError, bound_send_buffer, error_response
from .protocol import G711_ALIASES, G711_FORMATS, G711_RATE_HZ
from .truncation import SpokenWord, TextAligner
from .voice_names import OPENAI_VOICES as OPENAI_VOICES  # re-exported: voices_api.py reads them here
from .voice_names import QWEN3_SPEAKERS as QWEN3_SPEAKERS
from .voice_names import resolve_voice

# response_format -> Content-Type. OpenAI's names and default (mp3); pcm is raw int16 at the
# engine's rate (X-Sample-Rate). mulaw / alaw are G.711 at 8000 Hz, headerless, under the names of
# G711_ALIASES as well (telephony.py); audio/basic is RFC 2046's name for exactly that mu-law.
FORMATS = {
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",  # Ogg Opus (RFC 7845), 20 ms pages
    "aac": "audio/aac",  # ADTS
    "flac": "audio/flac",
    "wav": "audio/wav",  # sizes unknown in the header: encoders.UNKNOWN_WAV_SIZE
    "pcm": "audio/pcm",
    "mulaw": "audio/basic",
    "alaw": "audio/x-alaw",
}
DEFAULT_FORMAT = "mp3"
# raw audio bytes (default) | OpenAI's speech.audio.* SSE events | one JSON object with the whole
# audio (base64) and its word timings, as ElevenLabs' /with-timestamps answers
STREAM_FORMATS = ("audio", "sse", "json")


async def read_json_body(request: web.Request, timeout_s: float) -> Any:
    """The whole body (however many TCP writes it came in) as JSON, or web.HTTPException-like
    ``RequestError`` with a 4xx status: too large (413), too slow (408), not JSON (400)."""
    try:
        raw = await asyncio.wait_for(request.read(), timeout_s)
    except web.HTTPRequestEntityTooLarge:
        limit = request.app[GATEWAY].config.max_http_body_bytes
        raise RequestError(413, "body_too_large", f"bodies are limited to {limit} bytes") from None
    except TimeoutError:
        raise RequestError(408, "body_timeout", f"the body did not arrive within {timeout_s:g} s") from None
    try:
        return json.loads(raw)
    # ValueError covers JSONDecodeError, bad UTF-8 and integers past Python's digit limit;
    # RecursionError, nesting deeper than the parser's stack.
    except (ValueError, RecursionError):
        raise RequestError(400, "invalid_json", "the body must be JSON") from None


@dataclass(frozen=True)
class SpeechRequest:
    """A checked ``POST /v1/audio/speech`` body."""

    text: str
    params: StreamParams  # voice, speed, language and the model options (instructions, whole text)
    fmt: str  # a key of FORMATS (an alias already resolved)
    sse: bool  # stream_format "sse": the audio as base64 speech.audio.delta events
    timestamps: bool = False  # word timings: speech.audio.words events (sse), "words" (json)
    whole: bool = False  # stream_format "json": one object once the audio is complete


def _optional(body: dict[str, Any], name: str, kind: type, default: Any) -> Any:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise ValueError(f"invalid_{name}:{name} must be a {kind.__name__}")
    return value


def parse_speech(
    body: Any,
    voices: tuple[str, ...],
    max_chars: int,
    cloned: Callable[[str], StreamParams | None] | None = None,
) -> SpeechRequest:
    """Raises ValueError("code:message") for a body this server cannot take. ``cloned``: a stored
    voice's stream options by id or name (VoiceStore.stream_params), None for any other name."""
    if not isinstance(body, dict):
        raise ValueError("invalid_body:the body must be a JSON object")
    text = body.get("input")
    if not isinstance(text, str) or not text.strip():
        raise ValueError("invalid_input:input must be a non-empty string")
    if len(text) > max_chars:
        raise ValueError(f"input_too_long:input is limited to {max_chars} characters")
    _optional(body, "model", str, "")  # any name: the server serves one model
    voice_name = _optional(body, "voice", str, "")
    clone = cloned(voice_name) if cloned is not None and voice_name else None
    voice = "" if clone is not None else resolve_voice(voice_name, voices)  # UnknownVoice: invalid_voice
    fmt = body.get("response_format", DEFAULT_FORMAT)
    fmt = G711_ALIASES.get(fmt, fmt) if isinstance(fmt, str) else fmt
    if not isinstance(fmt, str) or fmt not in FORMATS:
        names = [*FORMATS, *(a for a in G711_ALIASES if a not in FORMATS)]
        raise ValueError(f"unsupported_format:response_format must be one of {', '.join(names)}")
    stream_format = body.get("stream_format", "audio")
    if not isinstance(stream_format, str) or stream_format not in STREAM_FORMATS:
        raise ValueError(
            f"unsupported_stream_format:stream_format must be one of {', '.join(STREAM_FORMATS)}"
        )
    speed = body.get("speed", 1.0)
    if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not 0.5 <= speed <= 2.0:
        raise ValueError("invalid_speed:speed must be a number within 0.5..2.0")
    # The answer always streams; harnesses send ``stream: true`` and get what they asked for.
    _optional(body, "stream", bool, True)
    language = _optional(body, "language", str, "")
    instructions = _optional(body, "instructions", str, "")
    extra: dict[str, object] = dict(clone.extra) if clone is not None else {}
    if instructions:
        extra["instruct"] = instructions  # Qwen3-TTS 1.7B; other models ignore it
    if _optional(body, "non_streaming_mode", bool, False):
        extra["whole_text"] = True  # Qwen3-TTS: the whole input in the prompt; others ignore it
    # Not OpenAI's: fixes the sampling noise of models that sample (same seed, voice and input:
    # the same audio), for tests and A/B listening.
    seed = _optional(body, "seed", int, None)
    if seed is not None and not 0 <= seed < 2**32:
        raise ValueError("invalid_seed:seed must be an integer within 0..4294967295")
    params = StreamParams(voice=voice, speed=float(speed), seed=seed, language=language, extra=extra)
    timestamps = _optional(body, "timestamps", bool, False)
    if timestamps and stream_format == "audio":
        raise ValueError("invalid_timestamps:word timings come with stream_format sse or json")
    whole = stream_format == "json"
    return SpeechRequest(text, params, fmt, stream_format == "sse", timestamps or whole, whole)


async def speech_handler(request: web.Request) -> web.StreamResponse:
    gw = request.app[GATEWAY]
    engine, cfg = gw.pick_engine(), gw.config
    refused = gw.admit(request, opens_session=False, json_body=True)
    if refused is not None:
        return refused
    if request.content_length is not None and request.content_length > cfg.max_http_body_bytes:
        return error_response(413, "body_too_large", f"bodies are limited to {cfg.max_http_body_bytes} bytes")
    try:
        body = await read_json_body(request, cfg.http_body_timeout_s)
        info = engine.info
        speech = parse_speech(
            body, info.voices, cfg.max_speech_input_chars, lambda v: gw.voices.stream_params(v, info)
        )
    except RequestError as err:
        return err.response()
    except ValueError as err:
        code, _, message = str(err).partition(":")
        return error_response(400, code, message)
    if gw.speech_requests >= (limit := gw.speech_limit()):
        return gw.refuse(request, 503, "too_many_requests", f"at most {limit} speech requests at once")
    client = gw.take_client(request, speech=True)
    if isinstance(client, web.Response):
        return client
    try:
        share = gw.stream_share(client)
        if not share.admit():
            gw.metrics.quota_refusals.labels("streams").inc()
            refused = gw.refuse(
                request, 429, "share_exceeded", "this client holds its share of the engine's streams while others wait"
            )
            refused.headers["Retry-After"] = "1"
            return refused
        try:
            stream = engine.open_stream(dataclasses.replace(speech.params, tenant=share.tenant))
        except ValueError as err:  # an option the model refuses (StreamParams.check)
            return error_response(400, "invalid_request", _engine_message(err))
        except EngineBusy as err:
            return gw.refuse(request, 503, "server_busy", str(err))
        except EngineNotReady as err:
            return error_response(503, "not_ready", str(err))
        share.hold(stream)
        gw.speech_requests += 1
        try:
            return await _stream_speech(request, stream, speech, engine.info)
        finally:
            gw.speech_requests -= 1
    finally:
        gw.give_client(client, speech=True)


# Stream errors that the input caused, and the code each is answered with (the rest are the
# server's: 500 model_error). The engine's "bad_request" is an option the model refused as the
# stream's slot opened (an unknown language on Qwen3-TTS): the invalid_request an option refused
# before opening gets.
_INPUT_STREAM_ERRORS = {
    "text_budget_exceeded": "text_budget_exceeded",
    "text_overflow": "text_overflow",
    "bad_request": "invalid_request",
}
# An engine message quotes what it refused (a language, a voice) whole; this much of it is
# answered: the value's start and the list of accepted ones (Qwen3-TTS's languages: ~120 characters).
MAX_ENGINE_MESSAGE_CHARS = 400


def _engine_message(err: Exception) -> str:
    message = str(err)
    return message if len(message) <= MAX_ENGINE_MESSAGE_CHARS else message[:MAX_ENGINE_MESSAGE_CHARS] + "..."


async def _stream_speech(
    request: web.Request, stream: Stream, speech: SpeechRequest, info: ModelInfo
) -> web.StreamResponse:
    stall_s = request.app[GATEWAY].config.write_stall_timeout_s
    rate = G711_RATE_HZ if speech.fmt in G711_FORMATS else info.sample_rate_hz
    stream.push_text(speech.text)
    stream.end()
    chunks = aiter(stream)
    first = None
    try:
        # Headers wait for the first audio (they would carry nothing before it), so a turn that
        # fails or has nothing to speak still gets an honest status instead of an empty 200.
        async for chunk in chunks:
            if chunk.pcm.size:
                first = chunk
                break
    except StreamError as err:
        code = _INPUT_STREAM_ERRORS.get(err.code)
        return error_response(400 if code else 500, code or "model_error", _engine_message(err))
    if first is None:
        stream.cancel()
        return error_response(400, "no_speech", "the input has nothing this voice can speak")
    content_type = "text/event-stream" if speech.sse else "application/json" if speech.whole else FORMATS[speech.fmt]
    resp = web.StreamResponse(headers={"Content-Type": content_type, "X-Sample-Rate": str(rate)})
    if speech.sse:
        resp.headers["Cache-Control"] = "no-cache"
    resp.enable_chunked_encoding()
    samples = 0
    encoder = speech_encoder(speech.fmt, info.sample_rate_hz)
    aligner = TextAligner()
    aligner.push(speech.text)
    words: list[dict[str, object]] = []
    whole = bytearray()  # stream_format json: the audio, answered once complete

    async def send(data: bytes) -> None:
        # A client that stops reading must not hold its engine stream: a write blocks only while
        # the socket's buffers are full.
        if not data:  # an encoder still filling its first frame
            return
        if speech.whole:
            whole.extend(data)
            return
        if speech.sse:
            data = sse_event({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()})
        await asyncio.wait_for(resp.write(data), stall_s)

    async def send_words(chunk: AudioChunk) -> None:
        # Before the audio holding each word's first sample, as turn.words on the WebSocket; times
        # from the first sample of the answer's audio, at the engine's rate whatever the format's
        timed = [
            SpokenWord(w.word, w.start, w.end, *aligner.locate(w.word)).describe(info.sample_rate_hz)
            for w in chunk.words
        ]
        words.extend(timed)
        if speech.sse and speech.timestamps and timed:
            await asyncio.wait_for(resp.write(sse_event({"type": "speech.audio.words", "words": timed})), stall_s)

    async def send_audio(pcm: np.ndarray) -> None:
        step = encoder.slice_samples or pcm.size
        for start in range(0, pcm.size, step):
            if start:
                await asyncio.sleep(0)  # other sessions run between one slice's encoding and the next
            await send(encoder.push(pcm[start : start + step]))

    try:
        await resp.prepare(request)
        bound_send_buffer(request, request.app[GATEWAY].config.send_buffer_bytes)
        await send_words(first)
        await send_audio(first.pcm)
        samples += first.pcm.size
        async for chunk in chunks:
            await send_words(chunk)
            if chunk.pcm.size:
                await send_audio(chunk.pcm)
                samples += chunk.pcm.size
        await send(encoder.flush())
        if speech.sse:
            await resp.write(sse_event({"type": "speech.audio.done", "usage": _usage(speech, samples, info)}))
        if speech.whole:
            answer = {
                "audio": base64.b64encode(bytes(whole)).decode(),
                "content_type": FORMATS[speech.fmt],
                "sample_rate": rate,
                "words": words,
                "usage": _usage(speech, samples, info),
            }
            await asyncio.wait_for(resp.write(json.dumps(answer, separators=(",", ":")).encode()), stall_s)
        await resp.write_eof()
    except TimeoutError:
        if request.transport is not None:
            request.transport.close()
    except StreamError:
        # Headers are out: the only honest signal left is to cut the body short.
        if request.transport is not None:
            request.transport.close()
    except (ConnectionResetError, OSError):
        pass
    finally:
        stream.cancel()  # no-op when finished; frees the engine slot if the client left early
    return resp


def sse_event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def _usage(speech: SpeechRequest, samples: int, info: ModelInfo) -> dict[str, int]:
    """The done event's ``usage``: the gateway does not see the model's tokenizer, so input tokens
    are the input's characters; output tokens are the model's frames (Qwen3-TTS: 80 ms codec
    frames; the embedded voice: 12.5 ms spectral frames)."""
    inp = len(speech.text)
    out = -(-samples // info.frame_samples)
    return {"input_tokens": inp, "output_tokens": out, "total_tokens": inp + out}


async def models_handler(request: web.Request) -> web.Response:
    """``GET /v1/models``: the one model this server serves (the API key when auth is on)."""
    gw = request.app[GATEWAY]
    refused = gw.check_key(request)
    if refused is not None:
        return refused
    try:
        name = gw.engine.info.name
    except EngineNotReady:
        name = gw.config.engine.model  # still loading: the name it was asked to serve
    model = {"id": name, "object": "model", "created": 0, "owned_by": "voicewire"}
    return web.json_response({"object": "list", "data": [model]})


async def healthz_handler(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    engine = gw.engine
    body: dict[str, Any] = {
        "status": "ok",
        "ready": engine.ready,
        "active_streams": engine.active_streams(),
        "sessions": len(gw.sessions),
    }
    try:
        info = engine.info
        # random weights speak noise: say so where an operator looks first
        body.update(model=info.name, sample_rate=info.sample_rate_hz, random_weights=info.random_weights)
    except EngineNotReady:
        body["model"] = gw.config.engine.model  # still loading: the name it was asked to serve
    return web.json_response(body)
