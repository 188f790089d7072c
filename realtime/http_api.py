"""HTTP API: ``POST /v1/audio/speech`` (OpenAI-compatible, streamed) and ``GET /healthz``."""

from __future__ import annotations

import json
import struct
from typing import Any

from aiohttp import web

from engine import Engine, EngineBusy, StreamError

from .audio import pcm16_bytes
from .gateway import GATEWAY

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
    body = {
        "error": {
            "type": "invalid_request_error" if status < 500 else "server_error",
            "code": code,
            "message": message,
        }
    }
    return web.json_response(body, status=status)


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
    voices = engine.model.info.voices
    if voice in OPENAI_VOICES:
        voice = ""
    elif voice and voice not in voices:
        raise ValueError(
            f"invalid_voice:unknown voice {voice!r}; use one of {', '.join(voices)} or an OpenAI name"
        )
    fmt = body.get("response_format", "wav")
    if fmt not in FORMATS:
        raise ValueError(f"unsupported_format:response_format must be one of {', '.join(FORMATS)}")
    speed = body.get("speed", 1.0)
    if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not 0.5 <= speed <= 2.0:
        raise ValueError("invalid_speed:speed must be a number within 0.5..2.0")
    return text, voice, fmt, float(speed)


async def speech_handler(request: web.Request) -> web.StreamResponse:
    gw = request.app[GATEWAY]
    engine, cfg = gw.engine, gw.config
    if request.content_length is not None and request.content_length > cfg.max_http_body_bytes:
        return _error(413, "body_too_large", f"bodies are limited to {cfg.max_http_body_bytes} bytes")
    try:
        raw = await request.content.read(cfg.max_http_body_bytes + 1)
        if len(raw) > cfg.max_http_body_bytes:
            return _error(413, "body_too_large", f"bodies are limited to {cfg.max_http_body_bytes} bytes")
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return _error(400, "invalid_json", "the body must be JSON")
    try:
        text, voice, fmt, speed = _parse_speech(body, engine, cfg.max_speech_input_chars)
    except ValueError as err:
        code, _, message = str(err).partition(":")
        return _error(400, code, message)
    try:
        stream = engine.open_stream(voice=voice, speed=speed)
    except EngineBusy as err:
        return _error(503, "server_busy", str(err))
    stream.push_text(text)
    stream.end()
    rate = engine.model.info.sample_rate_hz
    resp = web.StreamResponse(headers={"Content-Type": FORMATS[fmt], "X-Sample-Rate": str(rate)})
    resp.enable_chunked_encoding()
    try:
        await resp.prepare(request)
        if fmt == "wav":
            await resp.write(streaming_wav_header(rate))
        async for chunk in stream:
            if chunk.pcm.size:
                await resp.write(pcm16_bytes(chunk.pcm))
        await resp.write_eof()
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
    info = engine.model.info
    return web.json_response(
        {
            "status": "ok",
            "model": info.name,
            "sample_rate": info.sample_rate_hz,
            "active_streams": engine.active_streams(),
            "sessions": len(gw.sessions),
        }
    )
