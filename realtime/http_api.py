"""HTTP API: ``POST /v1/audio/speech`` (OpenAI-compatible, streamed) and ``GET /healthz``."""

from __future__ import annotations

import asyncio
import json
import struct
from typing import Any

from aiohttp import web

from voicewire.engine import Engine, EngineBusy, EngineNotReady, Stream, StreamError

from .audio import pcm16_bytes
from .gateway import GATEWAY, error_body

# OpenAI's built-in voice names; a drop-in client always sends one. They all map to this server's
# default voice (the model's own voice names are accepted too).
OPENAI_VOICES = frozenset(
    [
        "alloy",
        "ash",
        "ballad",
        "coral",
        "echo",
        "fable",
        "nova",
        "onyx",
        "sage",
        "shimmer",
        "verse",
        "marin",
        "cedar",
    ]
)
FORMATS = {"wav": "audio/wav", "pcm": "audio/pcm"}


def _error(status: int, code: str, message: str) -> web.Response:
    return web.json_response(error_body(status, code, message), status=status)


async def read_json_body(request: web.Request, timeout_s: float) -> Any:
    """The whole body (however many TCP writes it came in) as JSON, or web.HTTPException-like
    ``BodyError`` with a 4xx status: too large (413), too slow (408), not JSON (400)."""
    try:
        raw = await asyncio.wait_for(request.read(), timeout_s)
    except web.HTTPRequestEntityTooLarge:
        limit = request.app[GATEWAY].config.max_http_body_bytes
        raise BodyError(413, "body_too_large", f"bodies are limited to {limit} bytes") from None
    except TimeoutError:
        raise BodyError(408, "body_timeout", f"the body did not arrive within {timeout_s:g} s") from None
    try:
        return json.loads(raw)
    # ValueError covers JSONDecodeError, bad UTF-8 and integers past Python's digit limit;
    # RecursionError, nesting deeper than the parser's stack.
    except (ValueError, RecursionError):
        raise BodyError(400, "invalid_json", "the body must be JSON") from None


class BodyError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message

    def response(self) -> web.Response:
        resp = _error(self.status, self.code, self.message)
        if self.status in (408, 413):
            # The rest of the body is still on the wire: close instead of lingering to read it.
            resp.force_close()
        return resp


def streaming_wav_header(sample_rate_hz: int) -> bytes:
    """A WAV header for a stream of unknown length (sizes set to the maximum, as streaming servers do)."""
    unknown = 0xFFFFFFFF
    return (
        b"RIFF"
        + struct.pack("<I", unknown)
        + b"WAVE"
        + b"fmt "
        + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate_hz, sample_rate_hz * 2, 2, 16)
        + b"data"
        + struct.pack("<I", unknown)
    )


def _parse_speech(body: Any, engine: Engine, max_chars: int) -> tuple[str, str, str, float]:
    if not isinstance(body, dict):
        raise ValueError("invalid_body:the body must be a JSON object")
    text = body.get("input")
    if not isinstance(text, str) or not text.strip():
        raise ValueError("invalid_input:input must be a non-empty string")
    if len(text) > max_chars:
        raise ValueError(f"input_too_long:input is limited to {max_chars} characters")
    model = body.get("model", "")
    if not isinstance(model, str):
        raise ValueError("invalid_model:model must be a string")
    voice = body.get("voice", "")
    if not isinstance(voice, str):
        raise ValueError("invalid_voice:voice must be a string")
    voices = engine.info.voices
    if voice in OPENAI_VOICES:
        voice = ""
    elif voice and voice not in voices:
        raise ValueError(
            f"invalid_voice:unknown voice {voice!r}; use one of {', '.join(voices)} or an OpenAI name"
        )
    fmt = body.get("response_format", "wav")
    if not isinstance(fmt, str) or fmt not in FORMATS:
        raise ValueError(f"unsupported_format:response_format must be one of {', '.join(FORMATS)}")
    speed = body.get("speed", 1.0)
    if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not 0.5 <= speed <= 2.0:
        raise ValueError("invalid_speed:speed must be a number within 0.5..2.0")
    return text, voice, fmt, float(speed)


async def speech_handler(request: web.Request) -> web.StreamResponse:
    gw = request.app[GATEWAY]
    engine, cfg = gw.pick_engine(), gw.config
    refused = gw.admit(request, opens_session=False, json_body=True)
    if refused is not None:
        return refused
    if request.content_length is not None and request.content_length > cfg.max_http_body_bytes:
        return _error(413, "body_too_large", f"bodies are limited to {cfg.max_http_body_bytes} bytes")
    try:
        body = await read_json_body(request, cfg.http_body_timeout_s)
        text, voice, fmt, speed = _parse_speech(body, engine, cfg.max_speech_input_chars)
    except BodyError as err:
        return err.response()
    except ValueError as err:
        code, _, message = str(err).partition(":")
        return _error(400, code, message)
    if gw.speech_requests >= cfg.max_speech_requests:
        return gw.refuse(
            request, 503, "too_many_requests", f"at most {cfg.max_speech_requests} speech requests at once"
        )
    try:
        stream = engine.open_stream(voice=voice, speed=speed)
    except EngineBusy as err:
        return _error(503, "server_busy", str(err))
    except EngineNotReady as err:
        return _error(503, "not_ready", str(err))
    gw.speech_requests += 1
    try:
        return await _stream_speech(request, stream, text, fmt, engine.info.sample_rate_hz)
    finally:
        gw.speech_requests -= 1


# Stream errors that the input caused (the rest are the server's: 500 model_error).
_INPUT_STREAM_ERRORS = frozenset({"text_budget_exceeded", "text_overflow", "bad_request"})


async def _stream_speech(
    request: web.Request, stream: Stream, text: str, fmt: str, rate: int
) -> web.StreamResponse:
    stall_s = request.app[GATEWAY].config.write_stall_timeout_s
    stream.push_text(text)
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
        status = 400 if err.code in _INPUT_STREAM_ERRORS else 500
        return _error(status, err.code if status == 400 else "model_error", str(err))
    if first is None:
        stream.cancel()
        return _error(400, "no_speech", "the input has nothing this voice can speak")
    resp = web.StreamResponse(headers={"Content-Type": FORMATS[fmt], "X-Sample-Rate": str(rate)})
    resp.enable_chunked_encoding()
    try:
        await resp.prepare(request)
        if fmt == "wav":
            await resp.write(streaming_wav_header(rate))
        await asyncio.wait_for(resp.write(pcm16_bytes(first.pcm)), stall_s)
        async for chunk in chunks:
            if chunk.pcm.size:
                # A client that stops reading must not hold its engine stream: a write blocks
                # only while the socket's buffers are full.
                await asyncio.wait_for(resp.write(pcm16_bytes(chunk.pcm)), stall_s)
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
        body.update(model=info.name, sample_rate=info.sample_rate_hz)
    except EngineNotReady:
        body["model"] = gw.config.engine.model  # still loading: the name it was asked to serve
    return web.json_response(body)
